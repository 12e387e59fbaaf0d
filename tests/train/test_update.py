"""The jitted update on the tiny Qwen3-VL policy and real toy episodes: proximal log-probs, advantages, updates."""

import jax
import numpy as np
import pytest

from configs.constT10 import get_config
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.train import rl_config
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.update import OptimizerConfig, Updater, UpdateSettings
from tests.train.conftest import play_toy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def updater(policy):
    """One updater for the module: its jitted minibatch step compiles once for the shared batch shape."""
    config = get_config("toy")
    config.train.ppo_n_minibatches, config.train.ppo_n_epochs = 2, 3   # several minibatches and epochs per batch
    return updater_for(policy, config)


def updater_for(policy, config):
    a, t = config.actor, config.train
    optimizer = OptimizerConfig(lr=t.lr, total_steps=10, max_grad_norm=t.max_grad_norm,
                                updates_per_step=t.ppo_n_minibatches * t.ppo_n_epochs)
    settings = UpdateSettings(loss=a.loss, loss_kwargs=rl_config.loss_kwargs(a), use_decoupled_loss=True,
                              n_minibatches=t.ppo_n_minibatches, n_epochs=t.ppo_n_epochs,
                              advantage=rl_config.advantage_config(a, max_new_tokens=64))
    updater = Updater(policy.module, settings, optimizer)
    return updater, updater.optimizer


def test_update_moves_success_up_and_failure_down(policy, updater, toy_buffer):
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    rewards = [float(e["reward"][-1]) for e in episodes]
    assert 0 < sum(rewards) < len(rewards)  # mixed outcomes, so advantages are not all zero
    batch, rows = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                           n_minibatches=2, max_seq_len=512)
    updater, tx = updater
    params = jax.tree.map(lambda x: x.copy(), policy.params)
    before = updater.proximal_logprobs(params, batch)

    # the proximal log-probs are the Policy's own teacher-forced log-probs (same forward, same images) on the
    # tokens that carry loss (the LM head runs there only; 0 elsewhere)
    logits = policy.logits(batch.input_ids[:2], batch.attention_mask[:2],
                           batch.pixel_values[:2 * 16], batch.image_grid_thw[:2])
    lp = jax.nn.log_softmax(np.asarray(logits)[:, :-1], -1)
    manual = np.take_along_axis(lp, batch.input_ids[:2, 1:, None], -1)[..., 0]
    on_loss = batch.loss_mask[:2, 1:] > 0
    np.testing.assert_allclose(before[:2, 1:][on_loss], manual[on_loss], atol=2e-5)
    assert (before[:2, 1:][~on_loss] == 0).all()

    new_params, _, stats = updater(params, tx.init(params), batch)
    assert stats["optimizer_updates"] == 6 and np.isfinite(stats["actor_loss"])
    for key in ("clip_ratio", "dual_clip_ratio", "behave_cap_ratio"):
        assert 0.0 <= stats[f"loss_stats/{key}"] <= 1.0
    after = updater.proximal_logprobs(new_params, batch)
    n = batch.num_real_rows
    mask = batch.loss_mask[:n].astype(bool)
    delta = (after - before)[:n]
    won = np.array([r["reward"] > 0 for r in rows])
    success_shift = delta[won][mask[won]].mean()
    failure_shift = delta[~won][mask[~won]].mean()
    assert success_shift > failure_shift, (success_shift, failure_shift)


def test_update_is_deterministic(policy, updater, toy_buffer):
    play_toy(toy_buffer, groups=2, group_size=4, epsilon=0.6, seed=3)
    episodes, _ = toy_buffer.read(None, group_size=4)
    batch, _ = assemble(episodes, screenshots=toy_buffer.screenshots, image_processor=policy.processor.image_processor,
                        n_minibatches=2, max_seq_len=512)
    updater, tx = updater
    outs = []
    for _ in range(2):
        params = jax.tree.map(lambda x: x.copy(), policy.params)
        outs.append(updater(params, tx.init(params), batch)[0])
    for a, b in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
