"""Orbax checkpoints round-trip params, optimizer state, RNG and progress; retention keeps last K plus best;
metrics land as flat JSONL records and TensorBoard events."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.train.metrics import MetricsWriter, read_metrics


def _state():
    params = {"dense": {"kernel": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}, "bias": jnp.ones(3, jnp.bfloat16)}
    tx = optax.adamw(1e-2)
    return params, tx, tx.init(params)


def test_round_trip_restores_exact_state_and_meta(tmp_path):
    params, tx, opt_state = _state()
    grads = jax.tree.map(jnp.ones_like, params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    rng = jax.random.fold_in(jax.random.key(3), 7)
    ck = Checkpointer(str(tmp_path / "checkpoints"), keep=2)
    meta = {"policy_version": 4, "buffer_cursor": {"episodes": 17}, "episodes_trained": [1, 2, 3]}
    ck.save(4, params=params, opt_state=opt_state, rng=rng, meta=meta, metrics={"rollout/reward": 0.5})
    ck.wait()

    fresh_params, _, fresh_opt = _state()
    got_params, got_opt, got_rng, got_meta = Checkpointer(str(tmp_path / "checkpoints")).restore(
        params=fresh_params, opt_state=fresh_opt, rng=jax.random.key(0))
    for a, b in zip(jax.tree.leaves((params, opt_state)), jax.tree.leaves((got_params, got_opt))):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert jax.tree.structure(got_opt) == jax.tree.structure(opt_state)
    np.testing.assert_array_equal(jax.random.key_data(got_rng), jax.random.key_data(rng))
    assert got_meta == {**meta, "step": 4}
    ck.close()


def test_keeps_last_k_and_best(tmp_path):
    params, _, opt_state = _state()
    ck = Checkpointer(str(tmp_path / "ck"), keep=2, best_metric="rollout/reward")
    for step, reward in zip(range(1, 7), [0.1, 0.9, 0.2, 0.3, 0.4, 0.0]):
        ck.save(step, params=params, opt_state=opt_state, rng=jax.random.key(step), meta={}, metrics={"rollout/reward": reward})
    ck.wait()
    assert ck.all_steps() == [2, 5, 6]
    assert sorted(int(d) for d in os.listdir(tmp_path / "ck") if d.isdigit()) == [2, 5, 6]
    ck.close()


def test_metrics_jsonl_and_tensorboard(tmp_path):
    writer = MetricsWriter(str(tmp_path), total_steps=2, progress_bar=True)
    writer.write(1, {"rollout/reward": 0.25, "ppo_actor/update/actor_loss/avg": float("nan")},
                 histograms={"rollout/staleness": [0, 1, 1, 2]})
    writer.write(2, {"rollout/reward": 0.5})
    writer.close()
    records = read_metrics(str(tmp_path))
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["rollout/reward"] == 0.25 and records[0]["ppo_actor/update/actor_loss/avg"] is None
    with open(tmp_path / "metrics.jsonl") as f:
        assert all(isinstance(json.loads(line), dict) for line in f)
    events = os.listdir(tmp_path / "tensorboard")
    assert any(name.startswith("events.out.tfevents") for name in events)


# A fresh process (the suite's already imported torch): MetricsWriter's TensorBoard writes scalars, a histogram and
# an image without importing torch, and torch still imports afterwards.
TORCH_FREE = """
import sys
import numpy as np
from jaxwebrl.train.metrics import MetricsWriter
writer = MetricsWriter(sys.argv[1], total_steps=1, progress_bar=False)
writer.write(1, {"rollout/reward": 0.5}, histograms={"rollout/staleness": [0, 1]})
writer._tb.add_image("episodes/0", np.zeros((4, 4, 3), np.uint8), 1, dataformats="HWC")
writer.close()
print("torch" in sys.modules)
import torch
print(torch.tensor([1.0]).item())
"""


def test_tensorboard_events_are_written_without_importing_torch(tmp_path):
    proc = subprocess.run([sys.executable, "-c", TORCH_FREE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "1.0"]
    events = [name for name in os.listdir(tmp_path / "tensorboard") if name.startswith("events.out.tfevents")]
    assert len(events) == 1 and os.path.getsize(tmp_path / "tensorboard" / events[0]) > 200


def test_resumed_writer_drops_the_steps_after_its_checkpoint(tmp_path):
    writer = MetricsWriter(str(tmp_path), total_steps=3, tensorboard=False, progress_bar=False)
    for step in (1, 2, 3):
        writer.write(step, {"rollout/reward": float(step)})
        writer.write_episodes(step, [10 * step, 10 * step + 1])
    writer.close()
    resumed = MetricsWriter(str(tmp_path), total_steps=3, tensorboard=False, progress_bar=False, start_step=1)
    resumed.write(2, {"rollout/reward": 20.0})
    resumed.close()
    assert [(r["step"], r["rollout/reward"]) for r in read_metrics(str(tmp_path))] == [(1, 1.0), (2, 20.0)]
    with open(tmp_path / "trained_episodes.jsonl") as f:
        assert [json.loads(line) for line in f] == [{"step": 1, "episode_ids": [10, 11]}]
