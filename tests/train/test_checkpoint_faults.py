"""A damaged checkpoint, a full disk at save time or a half-written JSONL line must cost one line, never the run's
older checkpoints or its resumability (real Orbax checkpoints, a real full tmpfs)."""

import json
import logging
import os
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.layout import restore_params, state_tree
from jaxwebrl.errors import CheckpointError, WorkdirError
from jaxwebrl.parallel.mesh import make_mesh
from jaxwebrl.train.metrics import MetricsWriter, read_metrics
from tests.disks import tmpfs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def state(seed=0, n=128):
    params = {"w": jax.random.normal(jax.random.key(seed), (n, n)), "b": jnp.zeros(n)}
    return params, optax.adam(1e-3).init(params)


def save_steps(directory, steps, **kw):
    ck = Checkpointer(str(directory), async_save=False, keep=5, **kw)
    for step in steps:
        params, opt = state(step)
        ck.save(step, params=params, opt_state=opt, rng=jax.random.key(step),
                meta={"step": step, "policy_version": step, "buffer_cursor": {"next": step, "pending": []},
                      "consumed_episode_ids": []})
    ck.close()


def restore(directory, mesh=None, **kw):
    """The newest readable step, into `state()`'s layout, or with every array's rows over all devices of `mesh`."""
    params, opt = state()
    if mesh is not None:
        rows = NamedSharding(mesh, P(mesh.axis_names))
        params, opt = jax.tree.map(lambda x: jax.device_put(x, rows) if x.ndim else x, (params, opt))
    return Checkpointer(str(directory), async_save=False).restore_newest_readable(
        params=params, opt_state=opt, rng=jax.random.key(0), **kw)


def test_resume_falls_back_to_the_newest_readable_checkpoint_naming_the_broken_ones(tmp_path, caplog):
    save_steps(tmp_path / "ck", [1, 2, 3, 4])
    (tmp_path / "ck" / "4" / "meta" / "metadata").write_text('{"step": 4, "policy_')     # cut mid-write
    meta, digests = (tmp_path / "ck" / "3" / item / "metadata" for item in ("meta", "digests"))   # an older meta
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "buffer_cursor"}))
    digests.write_text(json.dumps({k: v for k, v in json.loads(digests.read_text()).items() if k != "meta"}))
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.checkpoint.checkpointer"):
        params, _, _, got = restore(tmp_path / "ck", required_meta=("policy_version", "buffer_cursor"))
    assert got["step"] == 2
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(state(2)[0]["w"]))
    lines = [r.getMessage() for r in caplog.records]
    assert any("checkpoint of step 4" in m and "unreadable" in m and "JSONDecodeError" in m for m in lines)
    assert any("checkpoint of step 3" in m and "buffer_cursor" in m for m in lines)
    assert all("\n" not in m for m in lines)
    assert sorted(os.listdir(tmp_path / "ck" / "unreadable")) == ["3", "4"]   # kept for a post-mortem
    assert Checkpointer(str(tmp_path / "ck")).all_steps() == [1, 2]             # the next saves of 3, 4 are free


def test_no_readable_checkpoint_is_one_line_and_moves_nothing(tmp_path):
    save_steps(tmp_path / "ck", [1, 2])
    for step in (1, 2):
        for root, _, files in os.walk(tmp_path / "ck" / str(step) / "state"):
            for name in files:
                with open(os.path.join(root, name), "wb") as f:
                    f.write(os.urandom(64))
    with pytest.raises(CheckpointError, match=r"no checkpoint under .* can be restored \(step 2: .*; step 1: ") as e:
        restore(tmp_path / "ck")
    assert "\n" not in str(e.value) and len(str(e.value)) < 800
    assert sorted(os.listdir(tmp_path / "ck")) == ["1", "2"]


def _flip_a_byte_in_the_largest_array_file(step_dir) -> None:
    """One bit flipped in the middle of the step's largest array data file (the params' `w`: random, so it stays
    the largest compressed), the rest of the checkpoint intact."""
    files = [os.path.join(root, name) for root, _, names in os.walk(step_dir / "state") for name in names]
    victim = max((f for f in files if os.sep + "d" + os.sep in f), key=os.path.getsize)
    raw = bytearray(open(victim, "rb").read())
    raw[len(raw) // 2] ^= 0x10
    with open(victim, "wb") as f:
        f.write(raw)


def test_a_bit_flip_inside_a_saved_array_makes_resume_fall_back_naming_the_leaf(tmp_path, caplog):
    """Orbax checksums no array data: a flipped bit in a saved array restored silently as a changed weight. Each
    leaf's digest, saved with the step, makes that step damaged: resume takes the step before, and with none
    left it is refused in one line naming the leaf."""
    save_steps(tmp_path / "ck", [1, 2])
    as_bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), state()[0])   # the restore casts: no digest to compare
    assert restore_params(str(tmp_path / "ck"), as_bf16)[1]["step"] == 2
    _flip_a_byte_in_the_largest_array_file(tmp_path / "ck" / "2")
    mesh = make_mesh({"data": 2, "fsdp": 4})   # saved on one device, restored over 8: every leaf is still checked
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.checkpoint.checkpointer"):
        params, _, _, got = restore(tmp_path / "ck", mesh, set_aside=False)
    assert got["step"] == 1 and len(params["w"].sharding.device_set) == 8   # untouched: restores exactly
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(state(1)[0]["w"]))
    assert any("checkpoint of step 2" in r.getMessage() and "['params']['w']" in r.getMessage()
               for r in caplog.records), caplog.text
    params, meta = restore_params(str(tmp_path / "ck"), state()[0])   # eval / export / warm start: the same
    assert meta["step"] == 1
    _flip_a_byte_in_the_largest_array_file(tmp_path / "ck" / "1")
    with pytest.raises(CheckpointError, match=r"step 2: .*\['params'\]\['w'\].*step 1: .*\['params'\]\['w'\]"):
        restore(tmp_path / "ck", set_aside=False)


def test_a_bit_flip_inside_a_saved_meta_makes_resume_fall_back_naming_it(tmp_path, caplog):
    """The meta is JSON: a flipped bit in a digit (the buffer cursor's 2 -> 3) still parses, and restored silently
    as another resume point (episodes read twice or lost). Its digest, saved with the step, makes that step
    damaged: resume takes the step before, and eval / export / warm start refuse it too."""
    save_steps(tmp_path / "ck", [1, 2])
    meta = tmp_path / "ck" / "2" / "meta" / "metadata"
    text = meta.read_text()
    assert '"next": 2' in text
    meta.write_text(text.replace('"next": 2', '"next": 3'))   # 0x32 -> 0x33: one bit
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.checkpoint.checkpointer"):
        params, _, _, got = restore(tmp_path / "ck", set_aside=False)
    assert got["step"] == 1 and got["buffer_cursor"] == {"next": 1, "pending": []}
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(state(1)[0]["w"]))
    assert any("checkpoint of step 2" in r.getMessage() and "meta differs from what was saved" in r.getMessage()
               for r in caplog.records), caplog.text
    assert restore_params(str(tmp_path / "ck"), state()[0])[1]["step"] == 1


def test_a_checkpoint_saved_with_crc32_digests_is_still_checked(tmp_path, caplog):
    """Steps saved before the device-side digest carry "crc32" digests (process 0's shards, keyed by global index):
    they restore, and a flipped bit in one is still seen, by its CRC-32."""
    save_steps(tmp_path / "ck", [1, 2])
    for step in (1, 2):   # the digests as the "crc32" writer wrote them: one device, so one shard a leaf
        params, opt = state(step)
        leaves = jax.tree_util.tree_flatten_with_path(state_tree(params, opt, jax.random.key(step)))[0]
        crc32 = {jax.tree_util.keystr(path): {
            "dtype": str(leaf.dtype), "shards": {",".join(f"0:{size}" for size in leaf.shape): zlib.crc32(
                np.ascontiguousarray(leaf).tobytes())}} for path, leaf in leaves}
        (tmp_path / "ck" / str(step) / "digests" / "metadata").write_text(
            json.dumps({"algorithm": "crc32", "leaves": crc32}))
    assert restore(tmp_path / "ck", set_aside=False)[3]["step"] == 2
    _flip_a_byte_in_the_largest_array_file(tmp_path / "ck" / "2")
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.checkpoint.checkpointer"):
        assert restore(tmp_path / "ck", set_aside=False)[3]["step"] == 1
    assert any("checkpoint of step 2" in r.getMessage() and "['params']['w'] (shard [0:128,0:128])" in r.getMessage()
               and "CRC-32" in r.getMessage() for r in caplog.records), caplog.text


def test_disk_full_at_save_is_one_line_naming_the_step_and_the_previous_checkpoint_stays(tmp_path):
    """Sync: refused before writing when the disk has less room than the last checkpoint took. Async: the failed
    background write is reported by check() as the step it happened at, its temp directory removed; Orbax's
    per-thread tracebacks are not printed."""
    script = r"""
import sys, time, jax, jax.numpy as jnp, optax
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.layout import restore_params
from jaxwebrl.errors import CheckpointError
params = {"w": jax.random.normal(jax.random.key(0), (256, 256))}
opt = optax.adam(1e-3).init(params)
ck = Checkpointer(sys.argv[1], keep=3, keep_best=False, async_save=sys.argv[2] == "async")
try:
    for step in (1, 2, 3):
        ck.save(step, params=params, opt_state=opt, rng=jax.random.key(step), meta={"step": step})
        for _ in range(100):   # the trainer calls check() once per train step
            time.sleep(0.05)
            ck.check()
except CheckpointError as err:
    print("ERROR", err)
finally:
    ck.close()             # as Trainer.close does: the reported failure is not raised again
"""
    for mode, size_kib, failed in (("sync", 520, 2), ("async", 200, 1)):
        with tmpfs(tmp_path / mode, size_kib) as disk:
            out = subprocess.run([sys.executable, "-c", script, os.path.join(disk, "ck"), mode], capture_output=True,
                                 text=True, timeout=120, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
            errors = [line for line in out.stdout.splitlines() if line.startswith("ERROR")]
            assert len(errors) == 1, out.stdout + out.stderr
            assert f"checkpoint of step {failed} could not be written" in errors[0] or \
                f"checkpoint of step {failed} not written" in errors[0], errors[0]
            assert "Traceback" not in out.stderr, out.stderr[-2000:]
            left = sorted(os.listdir(os.path.join(disk, "ck")))
            assert left == [str(s) for s in range(1, failed)], left     # nothing half-written stays behind
            if failed > 1:
                assert "the checkpoint of step 1 is intact" in errors[0] or "step 1 took" in errors[0]
                params = {"w": jnp.zeros((256, 256))}
                got, _, _, meta = Checkpointer(os.path.join(disk, "ck"), async_save=False).restore(
                    params=params, opt_state=optax.adam(1e-3).init(params), rng=jax.random.key(0))
                assert meta["step"] == 1 and float(jnp.abs(got["w"]).sum()) > 0


def test_half_written_jsonl_tails_are_dropped_on_resume_and_logged(tmp_path, caplog):
    writer = MetricsWriter(str(tmp_path), total_steps=3, tensorboard=False, progress_bar=False)
    for step in (1, 2):
        writer.write(step, {"rollout/reward": float(step)})
        writer.write_episodes(step, [step])
    writer.close()
    for name, tail in (("metrics.jsonl", '{"step": 3, "rollout/rew'), ("trained_episodes.jsonl", '{"step": 3}')):
        with open(tmp_path / name, "a") as f:
            f.write(tail)                                   # the process died mid-line (the second has no newline)
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.train.metrics"):
        resumed = MetricsWriter(str(tmp_path), total_steps=3, tensorboard=False, progress_bar=False, start_step=2)
    resumed.write(3, {"rollout/reward": 3.0})
    resumed.write_episodes(3, [3])
    resumed.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]
    with open(tmp_path / "trained_episodes.jsonl") as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3]
    assert sum("half-written last line" in r.getMessage() for r in caplog.records) == 2
    assert oct(os.stat(tmp_path / "metrics.jsonl").st_mode & 0o777) == "0o600"

    with open(tmp_path / "metrics.jsonl", "r+") as f:      # damage in the middle is not a crash artefact
        lines = f.readlines()
        lines[0] = "garbage\n"
        f.seek(0)
        f.writelines(lines)
    with pytest.raises(WorkdirError, match=r"metrics.jsonl:1 is damaged .* fix or delete that line"):
        MetricsWriter(str(tmp_path), total_steps=3, tensorboard=False, progress_bar=False, start_step=3)


def test_trainer_resumes_from_the_checkpoint_before_a_damaged_latest_one(toy_buffer, tmp_path):
    from jaxwebrl.models.policy import tiny_policy
    from jaxwebrl.train.trainer import Trainer
    from tests.train.test_trainer import RecordingSink, toy_config

    policy = tiny_policy(seed=0)
    trainer = Trainer(toy_config(5), str(tmp_path / "run"), policy=policy, buffer=toy_buffer,
                      weight_sink=RecordingSink())
    for step in (1, 2, 3):        # checkpoints of the real train state (no update needed for this)
        trainer.state.step = trainer.state.version = step
        trainer.save()
    trainer.close()
    (tmp_path / "run" / "checkpoints" / "3" / "meta" / "metadata").write_text("{")
    resumed = Trainer(toy_config(5), str(tmp_path / "run"), policy=policy, buffer=toy_buffer,
                      weight_sink=RecordingSink())
    assert (resumed.state.step, resumed.state.version) == (2, 2)
    resumed.close()


def test_a_save_right_after_an_unfinished_async_save_still_measures_the_room(tmp_path):
    """Async: the next save waits for the one in flight before measuring the room it needs (the trainer's last steps
    save back to back at the end of a run): a disk with room for one checkpoint refuses the second one by name,
    instead of skipping the check because the first was not yet listed."""
    script = r"""
import sys, jax, optax
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.layout import restore_params
from jaxwebrl.errors import CheckpointError
params = {"w": jax.random.normal(jax.random.key(0), (256, 256))}
opt = optax.adam(1e-3).init(params)
ck = Checkpointer(sys.argv[1], keep=3, keep_best=False, async_save=True)
try:
    for step in (1, 2):
        ck.save(step, params=params, opt_state=opt, rng=jax.random.key(step), meta={"step": step})
    ck.close()
    print("NO ERROR")
except CheckpointError as err:
    print("ERROR", err)
"""
    with tmpfs(tmp_path / "disk", 520) as disk:   # one checkpoint fits, two do not (as the sync case above)
        out = subprocess.run([sys.executable, "-c", script, os.path.join(disk, "ck")], capture_output=True,
                             text=True, timeout=120, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        lines = [line for line in out.stdout.splitlines() if line.startswith(("ERROR", "NO ERROR"))]
        assert lines and lines[0].startswith("ERROR checkpoint of step 2 not written"), out.stdout + out.stderr[-3000:]
        assert "step 1 took" in lines[0]
        assert sorted(os.listdir(os.path.join(disk, "ck"))) == ["1"]


def test_an_async_write_failure_first_seen_at_close_is_raised_there(tmp_path):
    """The run's last save is asynchronous and nothing checks it before close(): its failure must come out of
    close() (it used to be marked as reported when the error was made, and close() swallowed it)."""
    script = r"""
import sys, jax, optax
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.layout import restore_params
from jaxwebrl.errors import CheckpointError
params = {"w": jax.random.normal(jax.random.key(0), (256, 256))}
ck = Checkpointer(sys.argv[1], keep=3, keep_best=False, async_save=True)
try:
    ck.save(1, params=params, opt_state=optax.adam(1e-3).init(params), rng=jax.random.key(1), meta={"step": 1})
    ck.close()
    print("NO ERROR")
except CheckpointError as err:
    print("ERROR", err)
"""
    with tmpfs(tmp_path / "disk", 200) as disk:   # not even one checkpoint fits
        out = subprocess.run([sys.executable, "-c", script, os.path.join(disk, "ck")], capture_output=True,
                             text=True, timeout=120, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        lines = [line for line in out.stdout.splitlines() if line.startswith(("ERROR", "NO ERROR"))]
        assert lines and lines[0].startswith("ERROR checkpoint of step 1 could not be written"), \
            out.stdout + out.stderr[-3000:]
        assert "the disk is full" in lines[0] and "Traceback" not in out.stderr
