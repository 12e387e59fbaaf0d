"""The trainer loop on real buffered toy episodes: dashboard metrics, Orbax checkpoints, exact resume."""

import time

import jax
import numpy as np
import pytest

from configs.constT10 import get_config
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.train.metrics import DASHBOARD_KEYS, read_metrics
from jaxwebrl.train.trainer import Trainer
from tests.train.conftest import play_toy


class RecordingSink:
    """Stands where the policy server stands: receives every published version."""

    def __init__(self):
        self.versions = []

    def set_weights(self, params, version):
        self.versions.append(version)


def toy_config(max_steps):
    c = get_config("toy")
    c.train.max_steps = max_steps
    c.train.consumer_batch_size = 4         # 2 groups of 2: small rows, quick steps on a busy 2-core box
    c.env.group_size = 2
    c.train.ppo_n_epochs = 1
    c.train.dynamic_sampling = False        # every buffered group trains: the data suffices for 4 steps exactly
    c.rollout.max_head_offpolicyness = 100   # the episodes were all made before training starts
    c.buffer.max_seq_len = 512
    c.metrics.progress_bar = False
    c.checkpoint.async_save = True
    return c


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture
def filled_buffer(toy_buffer):
    play_toy(toy_buffer, groups=8, group_size=2, epsilon=0.6, seed=11)
    return toy_buffer


def train(config, workdir, policy, buffer, stop_at=None, timeout_s=900):
    sink = RecordingSink()
    trainer = Trainer(config, str(workdir), policy=policy, buffer=buffer, weight_sink=sink)
    deadline = time.monotonic() + timeout_s   # a starved run fails the test instead of hanging it
    trainer.run(stop=lambda: (stop_at is not None and trainer.state.step >= stop_at) or time.monotonic() > deadline)
    return trainer, sink


def test_steps_publish_versions_log_dashboard_and_checkpoint(policy, filled_buffer, tmp_path):
    trainer, sink = train(toy_config(2), tmp_path / "run", policy, filled_buffer)
    assert trainer.state.step == 2 and sink.versions == [0, 1, 2]
    records = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        missing = [k for k in DASHBOARD_KEYS if k not in record]
        assert not missing, missing
        assert np.isfinite(record["ppo_actor/update/actor_loss/avg"])
        assert record["ppo_actor/trajectories"] >= 4
    assert trainer.checkpointer.all_steps() == [1, 2]
    assert len(set(trainer.trained_episode_ids)) == len(trainer.trained_episode_ids)
    # the first step read the whole buffer: its seen-success is every episode's, before dynamic sampling
    episodes, _ = filled_buffer.read(None, group_size=2)
    won = np.mean([float(e["reward"][-1]) > 0 for e in episodes])
    assert records[0]["rollout/success_rate_seen"] == pytest.approx(won)


def test_two_steps_resume_two_steps_equals_four(policy, filled_buffer, tmp_path):
    straight, _ = train(toy_config(4), tmp_path / "straight", policy, filled_buffer)
    first, _ = train(toy_config(4), tmp_path / "resumed", policy, filled_buffer, stop_at=2)
    assert first.state.step == 2
    second, sink = train(toy_config(4), tmp_path / "resumed", policy, filled_buffer)
    assert sink.versions[0] == 2 and second.state.step == 4
    # every episode trained exactly once, and the same ones in the same order as the uninterrupted run
    assert first.trained_episode_ids + second.trained_episode_ids == straight.trained_episode_ids
    for a, b in zip(jax.tree.leaves(straight.state.params), jax.tree.leaves(second.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(straight.state.opt_state), jax.tree.leaves(second.state.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(jax.random.key_data(straight.state.rng), jax.random.key_data(second.state.rng))
