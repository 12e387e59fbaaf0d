"""The live-loop benchmarks' own arithmetic: bench/rollout.py's per-step breakdown and bench/async_vs_sync.py's
exactly-once audit of trained episodes against a real ring buffer's commit log, and its CPU-busy sampler."""

import json
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

import async_vs_sync
import rollout
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout.worker import STEP_TIMING_FIELDS
from tests.train.conftest import play_toy


def test_the_window_opens_and_closes_by_step_count_not_by_the_clock(tmp_path, monkeypatch):
    """Issue 44.10: a 12-s window after a 35-s warm-up held 0 steps on a loaded machine; the window is now counted in
    steps, so it holds at least `window_steps` however slowly they come, and a run that cannot fill it says so."""
    from jaxwebrl.rollout.worker_process import write_stats

    played = iter([0, 5, 12, 12, 20, 30, 31])    # the worker's steps at each read, one group at a time
    monkeypatch.setattr(rollout, "POLL_S", 0.0)

    def step_on():
        write_stats(str(tmp_path), 0, 0, {"steps": next(played), "recent_steps": []})

    window = rollout.Window(str(tmp_path), warmup_steps=10, window_steps=15, max_wait_s=60, check=step_on)
    assert window.open() == {(0, 0): 12}                          # opens at the first count >= 10
    after, seconds = window.close()
    assert after[0]["steps"] == 30 and seconds >= 0              # closes at the first count >= 12 + 15
    stalled = rollout.Window(str(tmp_path), warmup_steps=100, window_steps=1, max_wait_s=0.0)
    with pytest.raises(TimeoutError, match="the warm-up did not fill within --max_wait_s=0: 30 of 100 steps"):
        stalled.open()
    with pytest.raises(ValueError, match="must be >= 1"):
        rollout.Window(str(tmp_path), warmup_steps=10, window_steps=0, max_wait_s=1)


def test_breakdown_medians_transport_and_ratio():
    rows = [[0.001, 0.0, 0.030, 0.08, 0.002, 0.001, 0.020, 2, 0],
            [0.001, 0.0, 0.050, 0.09, 0.010, 0.002, 0.030, 3, 1],
            [0.001, 0.0, 0.040, 0.07, 0.004, 0.001, 0.025, 2, 0]]
    table = {name: np.array([r[i] for r in rows], float) for i, name in enumerate(STEP_TIMING_FIELDS)}
    out = rollout.breakdown(table)
    assert out["steps"] == 3 and out["median_s"]["generate_s"] == 0.04
    assert out["median_s"]["transport_s"] == pytest.approx(0.008, abs=1e-4)   # 0.030-0.002-0.001-0.020 = 0.007,
    assert out["compiled_fraction"] == pytest.approx(1 / 3, abs=1e-4)         # 0.008, 0.010 -> median 0.008
    assert out["median_generate_over_compute"] == pytest.approx(1.6, abs=1e-4)  # 1.5, 1.667, 1.6
    assert rollout.breakdown({name: np.array([]) for name in STEP_TIMING_FIELDS}) == {"steps": 0}


def test_new_steps_takes_only_the_window():
    before = {(0, 0): 2}
    after = [{"worker_id": 0, "incarnation": 0, "steps": 5, "recent_steps": [[1], [2], [3], [4], [5]]},
             {"worker_id": 1, "incarnation": 0, "steps": 2, "recent_steps": [[6], [7]]}]
    assert rollout._new_steps(after, before) == [[3], [4], [5], [6], [7]]


def test_audit_finds_twice_trained_and_unknown_episodes(tmp_path):
    buffer = RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=256, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    play_toy(buffer, groups=2, group_size=2, epsilon=0.5, seed=1)
    episodes, _ = buffer.read(None)
    ids = [e.episode_id for e in episodes]
    log = tmp_path / "trained_episodes.jsonl"
    log.write_text(json.dumps({"step": 1, "episode_ids": ids[:2]}) + "\n" +
                   json.dumps({"step": 2, "episode_ids": ids[2:]}) + "\n")
    assert async_vs_sync.audit(str(tmp_path), buffer) == {"trained": 4, "trained_twice": 0, "not_in_commit_log": 0,
                                                           "committed": 4, "ok": True}
    with open(log, "a") as f:
        f.write(json.dumps({"step": 3, "episode_ids": [ids[0], 10**9]}) + "\n")
    report = async_vs_sync.audit(str(tmp_path), buffer)
    assert report["trained_twice"] == 1 and report["not_in_commit_log"] == 1 and not report["ok"]


def test_async_vs_sync_summary_has_a_ratio_per_synchronous_arm_and_says_how_to_rerun_a_short_one():
    def arm(steps, per_hour, per_step):
        return {"steady_state_steps": steps, "trajectories_per_hour": per_hour, "seconds_per_step": per_step,
                "wall_s": 100.0}

    args = SimpleNamespace(regime="web", variant="tiny", num_workers=16, steps=5, max_minutes=20.0, override=[])
    report = async_vs_sync.summary({"sync_rebuilt": arm(5, 1000.0, 120.0), "sync": arm(5, 1500.0, 80.0),
                                    "async": arm(6, 3000.0, 40.0)}, args)
    assert report["steady_state_ratio_async_over_sync_rebuilt"] == 3.0
    assert report["steady_state_ratio_async_over_sync"] == 2.0 and report["needs"] is None
    short = async_vs_sync.summary({"sync_rebuilt": arm(3, 1000.0, 120.0), "async": arm(6, 3000.0, 40.0)}, args)
    assert short["steady_state_ratio_async_over_sync_rebuilt"] is None
    assert short["needs"] == "sync_rebuilt made 3 steady-state steps in 20 min: rerun with --max_minutes=14"
    counted = async_vs_sync.summary({"sync": arm(2, 1500.0, 80.0), "async": arm(2, 3000.0, 40.0)},
                                    SimpleNamespace(**{**vars(args), "steps": 2}))   # the count, not the clock
    assert counted["steady_state_ratio_async_over_sync"] is None
    assert counted["needs"] == "--steps=2 gives at most 2 steady-state steps a mode: a ratio needs --steps >= 5"


def test_cpu_busy_fraction_sees_a_busy_core():
    cpu = async_vs_sync.CpuBusy(period_s=0.05)
    t0 = time.time()
    while time.time() - t0 < 0.6:   # one core spinning: at least 1/N of the machine busy
        pass
    t1 = time.time()
    cpu.close()
    busy = cpu.fraction(t0, t1)
    assert busy is not None and 0.8 / os.cpu_count() <= busy <= 1.0
    assert cpu.fraction(t1 + 10, t1 + 20) is None   # no samples in that window
