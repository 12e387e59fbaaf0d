"""Critic PPO's value model in the real update: the tiny Qwen3-VL policy on real toy episodes, through rl_config as the
trainer builds it (configs/ppo.py:toy); the critic's state saved and restored with the policy's."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.ppo import get_config
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.layout import params_of
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.rl import advantages as adv_lib
from jaxwebrl.rl import gae as gae_lib
from jaxwebrl.train import rl_config
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.critic import CriticState
from jaxwebrl.train.update import Updater
from jaxwebrl.parallel import distributed, partition
from jaxwebrl.parallel import mesh as mesh_lib
from tests.train.conftest import assert_moments_like_weights, play_toy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


def _config():
    config = get_config("toy")
    config.train.max_steps, config.train.ppo_n_minibatches, config.train.ppo_n_epochs = 10, 2, 2
    return config


def _batch(policy, toy_buffer):
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    assert 0 < sum(e.reward for e in episodes) < len(episodes)
    return assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                    n_minibatches=2, max_seq_len=512)


def _leaves_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_critic_update_trains_the_value_model_next_to_the_policy(policy, toy_buffer, tmp_path):
    config = _config()
    critic = rl_config.value_model(config, policy)
    assert rl_config.critic_optimizer_settings(config).lr == config.critic.lr != config.train.lr
    updater = Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config),
                      critic=critic)
    params = jax.tree.map(lambda x: x.copy(), policy.params)
    critic.state = critic.init_state(params)
    assert "lm_head" not in critic.state.params["trunk"]   # the critic never reads the LM head
    batch = _batch(policy, toy_buffer)
    splits = [m for m in updater._split(batch) if m.policy_tokens > 0]
    values, _ = critic.batch_values(splits, batch.loss_mask.shape)
    assert float(jnp.abs(values).max()) == 0.0             # zero head: the first GAE is the critic-free one

    before = jax.tree.map(lambda x: x.copy(), critic.state)
    new_params, _, stats = updater(params, updater.optimizer.init(params), batch)
    assert stats["optimizer_updates"] == 4 and np.isfinite(stats["actor_loss"])
    assert stats["critic/value_loss"] > 0 and np.isfinite(stats["critic/grad_norm"])
    assert stats["critic/skipped_ratio"] == 0.0
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), critic.state.params, before.params)
    assert moved["value_head"]["kernel"] > 0 and max(jax.tree.leaves(moved["trunk"])) > 0
    after, _ = critic.batch_values(splits, batch.loss_mask.shape)
    real = batch.loss_mask[:batch.num_real_rows] > 0
    assert float(jnp.abs(after[:batch.num_real_rows][real]).mean()) > 0   # the values moved toward the returns
    # a non-finite critic step changes nothing (the in-jit guard) and is counted
    kept = jax.tree.map(lambda x: x.copy(), critic.state)
    m = splits[0]
    nan = jnp.full(m.minibatch.input_ids.shape, jnp.nan, jnp.float32)
    skipped = critic.update(m.minibatch, m.grid, nan, jnp.zeros_like(nan),
                            jnp.asarray(critic.value_mask(batch.loss_mask)[m.rows]))
    assert float(skipped["critic/skipped_ratio"]) == 1.0
    _leaves_equal(critic.state, kept)
    # the policy's own params never see the value head
    assert jax.tree.structure(new_params) == jax.tree.structure(policy.params)

    # saved in the same training checkpoint as the policy, restored bit-identical; params-only readers still work
    ck = Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
    opt_state = updater.optimizer.init(new_params)
    ck.save(1, params=new_params, opt_state=opt_state, rng=jax.random.key(1), meta={"policy_version": 1},
            critic=critic.state)
    template = critic.init_state(policy.params)
    got = Checkpointer(str(tmp_path / "checkpoints")).restore(params=policy.params, opt_state=opt_state,
                                                               rng=jax.random.key(0), critic=template)
    assert len(got) == 5 and isinstance(got[4], CriticState)
    _leaves_equal(got[4], critic.state)
    _leaves_equal(got[0], new_params)
    _leaves_equal(params_of(str(tmp_path / "checkpoints"), policy.params)[0], new_params)
    ck.close()


def test_a_critic_on_a_mesh_starts_its_adam_moments_sharded_like_its_trunk(policy):
    """(data 2, fsdp 2, tensor 2) over the 8 CPU devices: a bare `jax.jit(optimizer.init)` made every moment of the
    critic's trunk whole on device 0 (the AOT report counts them sharded)."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    params = distributed.shard_from_host(policy.params, partition.param_shardings(policy.params, mesh))
    state = rl_config.value_model(_config(), policy).init_state(params)
    assert_moments_like_weights(state.params, state.opt_state, skip="value_head")
    largest = max(jax.tree.leaves(state.opt_state), key=lambda x: x.size)   # the embedding's moment: split
    assert largest.addressable_shards[0].data.size < largest.size


def test_a_critic_update_on_a_mesh_keeps_its_state_on_the_partition_rules(policy):
    """Text rows on a (data 2, fsdp 2, tensor 2) mesh, the mesh in context as the trainer runs it: after the critic's
    updates its trunk and moments keep the layout they started in, as the policy's do (test_update.py)."""
    from tests.scale.train_steps import synthetic_episodes
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    params = distributed.shard_from_host(policy.params, partition.param_shardings(policy.params, mesh))
    critic = rl_config.value_model(_config(), policy)
    critic.state = critic.init_state(params)
    before = jax.tree.map(lambda x: x.sharding, critic.state)
    batch = assemble(synthetic_episodes(), screenshots=None, image_processor=None, n_minibatches=2, max_seq_len=64)
    config = _config()
    updater = Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config),
                      critic=critic)
    opt_state = partition.init_state(updater.optimizer.init, params)
    with jax.set_mesh(mesh):
        updater(params, opt_state, batch)
    after = jax.tree.map(lambda x: x.sharding, critic.state)
    for (path, old), new, leaf in zip(jax.tree_util.tree_leaves_with_path(before), jax.tree.leaves(after),
                                      jax.tree.leaves(critic.state)):
        name = partition.path_string(path)
        if "value_head" in name.split("/"):   # the small head (made on one device) ends replicated
            assert new.is_fully_replicated, (name, new)
        else:
            assert new.is_equivalent_to(old, leaf.ndim), (name, old, new)


def test_the_policy_step_follows_the_critics_values(policy, toy_buffer):
    """The critic's values are GAE's baseline: the same batch and policy with a critic whose value head reads the
    trunk (a non-zero kernel, so V varies token by token) takes another policy step than with the zero head, whose
    values are all 0. A run whose GAE never saw V (the values dropped on the way) steps the same under both."""
    config = _config()
    config.train.ppo_n_epochs = 1
    batch = _batch(policy, toy_buffer)

    def policy_step(head_scale):
        critic = rl_config.value_model(config, policy)
        critic.state = critic.init_state(policy.params)
        head = critic.state.params["value_head"]
        kernel = jax.random.normal(jax.random.key(7), head["kernel"].shape, jnp.float32) * head_scale
        critic.state = critic.state._replace(params={**critic.state.params,
                                                     "value_head": {**head, "kernel": kernel}})
        updater = Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config),
                          critic=critic)
        params = jax.tree.map(lambda x: x.copy(), policy.params)
        new_params, _, _ = updater(params, updater.optimizer.init(params), batch)
        return new_params

    zero, reading = policy_step(0.0), policy_step(1.0)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), zero, reading))
    assert max(moved) > 0, "the critic's values did not reach the advantages (GAE ran without V)"


def test_turn_unit_gae_runs_through_the_update(policy, toy_buffer):
    """gae_timestep_unit='turn' from the config: the Updater numbers each row's turns from its loss mask, GAE reads
    V at each turn's first token, and the critic's loss is taken there only."""
    config = _config()
    config.actor.gae_timestep_unit, config.train.ppo_n_epochs = "turn", 1
    critic = rl_config.value_model(config, policy)
    updater = Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config),
                      critic=critic)
    params = jax.tree.map(lambda x: x.copy(), policy.params)
    critic.state = critic.init_state(params)
    batch = _batch(policy, toy_buffer)
    value_mask = critic.value_mask(batch.loss_mask)
    with_response = batch.loss_mask.sum(-1) > 0
    assert (value_mask.sum(-1) == with_response).all()            # one turn a step row: its first token
    first = np.argmax(batch.loss_mask > 0, axis=-1)
    assert (value_mask[with_response, first[with_response]] == 1).all()
    _, _, stats = updater(params, updater.optimizer.init(params), batch)
    assert stats["optimizer_updates"] == 2 and np.isfinite(stats["actor_loss"]) and stats["critic/value_loss"] > 0


def test_a_checkpoint_without_a_critic_restores_for_a_run_without_one(policy, tmp_path):
    params = policy.params
    config = _config()
    updater = Updater(policy.module, rl_config.update_settings(config), rl_config.optimizer_settings(config))
    opt_state = updater.optimizer.init(params)
    ck = Checkpointer(str(tmp_path / "ck"), async_save=False)
    ck.save(3, params=params, opt_state=opt_state, rng=jax.random.key(2), meta={"policy_version": 3})
    ck.close()
    got = Checkpointer(str(tmp_path / "ck"), async_save=False).restore(params=params, opt_state=opt_state,
                                                                        rng=jax.random.key(0))
    assert len(got) == 4 and got[3]["policy_version"] == 3
    _leaves_equal(got[0], params)


@pytest.mark.parametrize("unit, lam_fn, kwargs", [("token", None, ""), ("token", "vapo_length_adaptive",
                                                                         '{"alpha": 0.05}'),
                                                  ("turn", None, ""), ("turn", "relative_position", '{"q": 0.5}')])
def test_gae_from_the_config_is_rl_gae_called_directly(unit, lam_fn, kwargs):
    """configs/ppo.py's advantage path with the config's GAE knobs equals rl/gae.py on the placed step rewards."""
    config = get_config("toy")
    a = config.actor
    a.discount, a.gae_lambda, a.gae_timestep_unit, a.max_turns = 0.9, 0.8, unit, 3
    a.gae_lambda_fn, a.gae_lambda_kwargs = lam_fn, kwargs
    a.adv_norm.mean_level = a.adv_norm.std_level = None      # GAE's own output, before the batch normalisation
    adv_config = rl_config.advantage_config(a, max_new_tokens=48)
    assert (adv_config.gae_timestep_unit, adv_config.max_turns, adv_config.discount) == (unit, 3, 0.9)
    rng = np.random.default_rng(0)
    rows, time = 6, 12
    mask = np.zeros((rows, time), np.int32)
    for r in range(rows):   # two responses in some rows (two turns), one in the others
        mask[r, 2:5 + r % 3] = 1
        if r % 2:
            mask[r, 8:11] = 1
    rewards = np.array([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
    episode_ids, group_ids = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 0, 0, 0, 1, 1])
    values = rng.normal(size=(rows, time)).astype(np.float32)
    turn_ids = np.asarray(gae_lib.turn_ids_from_mask(mask))
    assert turn_ids.max() == 1 and (turn_ids[mask == 0] == -1).all()
    trace = adv_lib.compute_token_advantages(rewards, episode_ids, group_ids, mask, config=adv_config,
                                             values=values, turn_ids=turn_ids if unit == "turn" else None)

    step = rewards / 2.0                                     # r / |τ|, no normalisation (estimator "gae")
    token_rewards = np.asarray(adv_lib.place_on_last_token(step, mask))
    if unit == "token":
        lengths = mask.sum(-1)
        lam = 0.8 if lam_fn is None else gae_lib.vapo_length_adaptive_lambda(lengths, alpha=0.05)
        adv, ret = gae_lib.masked_gae(token_rewards, mask, values, gamma=0.9, lam=lam)
    else:
        lam = 0.8 if lam_fn is None else gae_lib.relative_position_lambda(turn_ids.max(-1) + 1, q=0.5)
        adv, ret = gae_lib.turn_gae(token_rewards, turn_ids, values, max_turns=3, gamma=0.9, lam=lam)
    np.testing.assert_allclose(np.asarray(trace.advantages), np.asarray(adv), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(trace.returns), np.asarray(ret), rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(adv)).sum() > 0


def _trainer_config(max_steps):
    """configs/ppo.py:toy shrunk as tests/train/test_trainer.py shrinks constT10 (2 groups of 2 a step)."""
    c = get_config("toy")
    c.train.max_steps, c.train.consumer_batch_size, c.env.group_size = max_steps, 4, 2
    c.train.ppo_n_epochs, c.train.dynamic_sampling = 1, False
    c.rollout.max_head_offpolicyness = 100   # the episodes were all made before training starts
    c.metrics.progress_bar = False
    return c


@pytest.mark.slow   # four trainer steps with a critic: ~1.5 min alone, 6 min on the shared 2-core box
def test_one_step_resume_one_step_equals_two_with_the_critic(policy, toy_buffer, tmp_path):
    """The trainer saves the critic in its checkpoints and a resume restores it: 1 + 1 steps = 2 steps, bit for bit
    (policy, critic params and the critic's optimizer state)."""
    from tests.train.test_trainer import train   # the same driver as the policy's resume test

    play_toy(toy_buffer, groups=4, group_size=2, epsilon=0.6, seed=11)
    straight, _ = train(_trainer_config(2), tmp_path / "straight", policy, toy_buffer)
    fresh = straight.critic.init_state(policy.params)
    assert float(jnp.abs(straight.critic.state.params["value_head"]["kernel"]).max()) > 0   # it trained
    first, _ = train(_trainer_config(2), tmp_path / "resumed", policy, toy_buffer, stop_at=1)
    second, sink = train(_trainer_config(2), tmp_path / "resumed", policy, toy_buffer)
    assert first.state.step == 1 and second.state.step == 2 and sink.versions[0] == 1
    _leaves_equal(second.critic.state, straight.critic.state)
    _leaves_equal(second.state.params, straight.state.params)
    assert jax.tree.structure(fresh) == jax.tree.structure(second.critic.state)
