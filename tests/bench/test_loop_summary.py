"""bench/loop_summary.py: the loop-on-an-accelerator numbers read from a run's metrics.jsonl."""

import json

import pytest

from bench.loop_summary import summarize


def _write(workdir, records):
    with open(workdir / "metrics.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def test_steady_state_numbers_leave_out_the_first_update(tmp_path):
    _write(tmp_path, [   # out of order on disk: sorted by step
        {"step": 2, "time": 130.0, "throughput/tokens_per_s": 900.0, "trainer/idle_fraction": 0.2,
         "rollout/success_rate": 0.3},
        {"step": 1, "time": 100.0, "throughput/tokens_per_s": 10.0, "trainer/idle_fraction": 0.9,
         "rollout/success_rate": 0.25},
        {"step": 3, "time": 150.0, "throughput/tokens_per_s": 1100.0, "trainer/idle_fraction": 0.4},
    ])
    out = summarize(str(tmp_path), started_at=40.0)
    assert out["updates"] == 3 and out["first_update_s"] == 60.0
    assert out["seconds_per_update"] == {"median": 25.0, "min": 20.0, "max": 30.0, "n": 2}
    assert out["generation_tokens_per_s"]["median"] == 1000.0      # step 1 (compiles) left out
    assert out["trainer_idle_fraction"]["median"] == pytest.approx(0.3)
    assert out["success_rate"] == [0.25, 0.3, None] and "needs" not in out


def test_one_step_has_no_steady_state_and_says_what_to_do(tmp_path):
    _write(tmp_path, [{"step": 1, "time": 5.0}])
    out = summarize(str(tmp_path))
    assert out["seconds_per_update"] is None and out["first_update_s"] is None
    assert "max_steps" in out["needs"]


def test_a_run_without_metrics_is_named(tmp_path):
    with pytest.raises(ValueError, match="metrics.jsonl not found"):
        summarize(str(tmp_path))
