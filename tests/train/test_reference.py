"""The reference policy of a KL run (train/reference.py) through the real update on the tiny policy and real toy
episodes, the KL in the reward against a hand computation, the KL loss term, the in-jit non-finite guard, and the
refusals of validation."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.grpo import get_config
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.errors import ConfigChanged
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.rl import advantages as adv_lib
from jaxwebrl.train import reference, rl_config
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.config_validation import ConfigError, validate
from jaxwebrl.train.update import Updater
from tests.train.conftest import play_toy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture
def batch(policy, toy_buffer):
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    return assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                    n_minibatches=2, max_seq_len=512)


def toy_config(**actor):
    c = get_config("toy")
    c.train.max_steps, c.train.ppo_n_minibatches, c.train.ppo_n_epochs, c.train.lr = 10, 2, 1, 1e-3
    for key, value in actor.items():
        c.actor[key] = value
    return c


def updater_for(policy, config, ref=None):
    return Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config),
                   reference=ref)


def copy(tree):
    return jax.tree.map(lambda x: x.copy(), tree)


def host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_leaves_equal(a, b):
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def masked_mean(x, mask):
    return float((x * mask).sum() / max(mask.sum(), 1))


def test_the_reference_is_the_start_so_ref_kl_is_0_then_and_the_reward_kl_follows_the_formula(policy, batch,
                                                                                               tmp_path):
    config = toy_config(kl_ctl=0.05)
    ref = reference.load_reference(config, str(tmp_path), recipe_params=policy.params)
    assert ref.info == {"source": "recipe", "step": None}
    assert all(r is p for r, p in zip(jax.tree.leaves(ref.params), jax.tree.leaves(policy.params)))   # no copy
    with open(tmp_path / reference.RECORD_FILE) as f:
        assert json.load(f) == ref.info
    updater = updater_for(policy, config, ref)
    params = copy(policy.params)
    np.testing.assert_array_equal(updater.proximal_logprobs(ref.params, batch),
                                  updater.proximal_logprobs(params, batch))   # same pass, same LM-head chunks
    params, opt_state, first = updater(params, updater.optimizer.init(params), batch)
    assert first["ref_kl"] == 0.0

    prox, ref_lp = updater.proximal_logprobs(params, batch), updater.proximal_logprobs(ref.params, batch)
    _, _, second = updater(params, opt_state, batch)
    n = batch.num_real_rows
    mask = batch.objective_mask[:n].astype(np.float32)
    d = (prox - ref_lp)[:n]
    assert second["ref_kl"] > 1e-6
    assert second["ref_kl"] == pytest.approx(masked_mean(np.expm1(-d) + d, mask), rel=1e-4)   # k3, per token
    # the update's advantages: the path's with KL in the reward, -kl_ctl * (prox - ref) on every policy token,
    # summed from the token on (γ = λ = 1), on top of the step advantage
    plain = adv_lib.compute_token_advantages(batch.rewards[:n], batch.episode_ids[:n], batch.group_ids[:n],
                                             batch.loss_mask[:n], config=rl_config.advantage_config(
                                                 toy_config().actor, max_new_tokens=config.model.max_new_tokens))
    hand = np.asarray(plain.advantages) + np.where(
        batch.loss_mask[:n] > 0, np.cumsum((-0.05 * d * batch.loss_mask[:n])[:, ::-1], axis=1)[:, ::-1], 0.0)
    assert second["advantages"] == pytest.approx(masked_mean(hand, batch.loss_mask[:n]), rel=1e-4, abs=1e-7)
    assert abs(second["advantages"] - masked_mean(np.asarray(plain.advantages), batch.loss_mask[:n])) > 1e-7


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_in_the_reward_changes_the_advantages_as_the_formula_says(estimator):
    """Episode 0 (2 step rows, reward 1) and episode 1 (1 row, reward 0) of one group, 4 tokens a row."""
    config = toy_config(kl_ctl=0.1, kl_estimator=estimator)
    kl_config = rl_config.advantage_config(config.actor, max_new_tokens=48)
    assert (kl_config.kl_ctl, kl_config.kl_estimator) == (0.1, estimator)
    mask = np.array([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 0]], np.float32)
    lp = np.array([[0, -1.0, -0.5, 0], [0, 0, -2.0, -0.1], [-0.3, -0.7, -1.2, 0]], np.float32)
    ref = np.array([[0, -1.5, -0.5, 0], [0, 0, -1.0, -0.4], [-0.3, -0.2, -2.2, 0]], np.float32)
    trace = adv_lib.compute_token_advantages(np.array([1.0, 1.0, 0.0]), np.array([0, 0, 1]), np.array([0, 0, 0]),
                                             mask, config=kl_config, logprobs=lp, ref_logprobs=ref)
    d = lp - ref
    k = {"k1": d, "k2": 0.5 * d * d, "k3": np.exp(-d) - 1 + d}[estimator]
    r_hat = 0.5 / (0.5 + 1e-5)                                  # GRPO: (r - mean) / (population std + eps)
    step = np.array([r_hat / 2, r_hat / 2, -r_hat])             # / |τ|: episode 0 has 2 steps
    rewards = -0.1 * k * mask
    rewards[np.arange(3), [2, 3, 2]] += step                    # the step advantage on each row's last token
    hand = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1] * mask  # γ = λ = 1, no critic: the rewards to go
    np.testing.assert_allclose(np.asarray(trace.advantages), hand, rtol=1e-5, atol=1e-6)


def test_kl_loss_term_is_0_at_the_start_then_adds_coef_times_kl(policy, batch, tmp_path):
    config = toy_config(kl_loss_coef=0.5)
    config.train.ppo_n_minibatches = 1                         # one update a step: the first one is at the start
    ref = reference.load_reference(config, str(tmp_path), recipe_params=policy.params)
    updater = updater_for(policy, config, ref)
    params = copy(policy.params)
    params, opt_state, first = updater(params, updater.optimizer.init(params), batch)
    # the gradient pass's log-probs differ from the reference pass's in float rounding only (k3 ~ d² / 2)
    assert 0.0 <= first["loss_stats/kl"] < 1e-10
    assert first["actor_loss"] == pytest.approx(first["loss_stats/policy_loss"])
    _, _, second = updater(params, opt_state, batch)
    assert second["loss_stats/kl"] > 1e-6
    assert second["actor_loss"] == pytest.approx(second["loss_stats/policy_loss"] + 0.5 * second["loss_stats/kl"],
                                                 rel=1e-4)


def test_bf16_and_host_memory_reference_and_a_resume_reloads_the_recorded_step(policy, batch, tmp_path):
    source = Checkpointer(str(tmp_path / "source" / "checkpoints"), async_save=False)
    rng = jax.random.key(0)
    tx = optax.adam(1e-3)

    def save(step, params):
        source.save(step, params=params, opt_state=tx.init(params), rng=rng, meta={"policy_version": step})

    save(1, policy.params)
    config = toy_config(kl_ctl=0.05, ref_checkpoint=str(tmp_path / "source"), ref_dtype="bfloat16", ref_offload=True)
    run = str(tmp_path / "run")
    os.makedirs(run)
    ref = reference.load_reference(config, run, recipe_params=policy.params)
    assert ref.info == {"source": str(tmp_path / "source"), "step": 1}
    assert {x.dtype for x in jax.tree.leaves(ref.params)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(ref.params)} == {"pinned_host"}
    with ref.on_device() as on_device:
        assert {x.sharding.memory_kind for x in jax.tree.leaves(on_device)} == {"device"}
        assert_leaves_equal(on_device, jax.tree.map(lambda x: np.asarray(x, jnp.bfloat16), policy.params))
    updater = updater_for(policy, config, ref)
    params = copy(policy.params)
    _, _, stats = updater(params, updater.optimizer.init(params), batch)
    assert 0.0 < stats["ref_kl"] < 1e-3                         # bf16 rounding of the same weights only

    save(2, jax.tree.map(lambda x: x + 1.0, policy.params))     # the source run trains on
    source.close()
    resumed = reference.load_reference(config, run, recipe_params=policy.params)
    assert resumed.info["step"] == 1
    assert_leaves_equal(resumed.params, ref.params)
    other = toy_config(kl_ctl=0.05)                             # the recipe's weights instead
    with pytest.raises(ConfigChanged, match="reference.json: this run's reference is .*source.* but the config "
                                            "names 'recipe'"):
        reference.load_reference(other, run, recipe_params=policy.params)


def absurd(batch, rows):
    """`batch` with behaviour log-probs of `rows` at -3e38 on their policy tokens: the weights overflow."""
    behave = batch.behave_logprobs.copy()
    behave[rows] = np.where(batch.loss_mask[rows] > 0, -3e38, behave[rows])
    return batch._replace(behave_logprobs=behave)


def test_the_in_jit_guard_skips_a_poisoned_minibatch_and_leaves_the_state_bit_identical(policy, batch):
    config = toy_config()
    config.train.ppo_n_epochs = 2
    updater = updater_for(policy, config)
    params = copy(policy.params)
    opt_state = updater.optimizer.init(params)
    before = host((params, opt_state))
    params, opt_state, stats = updater(params, opt_state, absurd(batch, np.arange(len(batch.input_ids))))
    assert stats["optimizer_updates"] == stats["skipped_updates"] == 4
    assert not np.isfinite(stats["actor_loss"]) or not np.isfinite(stats["grad_norm"])
    assert_leaves_equal(host((params, opt_state)), before)     # params and AdamW state (its count too)

    first = updater._split(batch)[0].rows                       # poison one of the two minibatches only
    params, opt_state, stats = updater(params, opt_state, absurd(batch, first))
    assert stats["skipped_updates"] == 2 and stats["optimizer_updates"] == 4   # once an epoch
    assert np.isfinite(stats["actor_loss"]) and np.isfinite(stats["grad_norm"])  # the means of the kept ones
    after = host(params)
    assert all(np.isfinite(x).all() for x in after)
    assert max(float(np.abs(x - y).max()) for x, y in zip(after, before)) > 1e-5   # the clean minibatch trained
    assert int(np.asarray(opt_state[-1][0].count)) == 2


@pytest.mark.parametrize("actor, message", [
    ({"kl_ctl": 0.05, "kl_estimator": "k4"}, r"^actor\.kl_estimator='k4': use one of \('k1', 'k2', 'k3'\)$"),
    ({"kl_loss_coef": 0.1, "kl_loss_estimator": "mse"}, r"^actor\.kl_loss_estimator='mse': use one of"),
    ({"kl_ctl": 0.05, "ref_dtype": "float16"}, r"^actor\.ref_dtype='float16': use 'float32', 'bfloat16' or None"),
    ({"kl_ctl": -0.1}, r"^actor\.kl_ctl=-0\.1: must be >= 0"),
    ({"kl_ctl": 0.05, "ref_checkpoint": "/nonexistent/run"},
     r"^actor\.ref_checkpoint='/nonexistent/run': no params checkpoint .* or training checkpoint"),
    ({"ref_dtype": "bfloat16"}, r"^actor\.ref_dtype='bfloat16': no KL term reads the reference: set actor\.kl_ctl"),
    ({"ref_offload": True}, r"^actor\.ref_offload=True: no KL term reads the reference"),
])
def test_reference_settings_that_cannot_run_are_refused_in_one_line(actor, message, tmp_path):
    config = toy_config(**actor)
    with pytest.raises(ConfigError, match=message) as err:
        validate(config, str(tmp_path))
    assert "\n" not in str(err.value)


def test_a_kl_run_from_restore_from_must_name_its_reference(tmp_path):
    config = toy_config(kl_ctl=0.05)
    validate(config, str(tmp_path))                             # the recipe's weights: resolvable
    config.checkpoint.restore_from = str(tmp_path)
    with pytest.raises(ConfigError, match=r"^actor\.ref_checkpoint=None: a KL run started from "
                                          r"checkpoint\.restore_from needs its reference named"):
        validate(config, str(tmp_path))
