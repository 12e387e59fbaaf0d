"""launch/plan.py on the tiny default's own measured inputs, its one-line errors, and the committed validation
JSON reproduced by the code that wrote it."""

import json
import os
import subprocess
import sys

import pytest

from configs.constT10 import get_config
from jaxwebrl.plan.accelerators import AcceleratorTiming
from jaxwebrl.plan.validation import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "docs", "results")


def _plan(*flags):
    return subprocess.run([sys.executable, os.path.join(REPO, "launch", "plan.py"), *flags], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))


def test_the_plan_command_runs_on_the_tiny_defaults_measured_inputs():
    done = _plan("--config=configs/constT10.py", "--topology=cpu", "--regime=web", "--browsers=8", "--updates=4")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["topology"] == "cpu" and report["browsers"] == 8 and report["batch"] == 32
    for mode in ("async", "sync"):
        assert report[mode]["trajectories_per_hour"] > 0
        assert 0 <= report[mode]["trainer_idle_fraction"] <= 1
        assert set(report[mode]["staleness"]) == {"mean", "max", "distribution"}
    assert report["sync"]["staleness"]["max"] == 0
    assert report["async_over_sync"] > 0
    smallest = report["smallest_browsers_for_busy_trainer"]
    assert smallest["browsers"] is None or smallest["trainer_busy"] >= 0.9
    assert report["inputs"]["machine"]["sources"]["browser_step_s"].startswith("rollout_after.json")


def test_an_unknown_topology_is_one_line():
    done = _plan("--config=configs/constT10.py:qwen3vl_8b", "--topology=v9-8", "--browsers=8")
    assert done.returncode == 1
    assert done.stderr.strip().startswith("plan error: topology='v9-8'") and "v5p-8" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_committed_validation_is_reproduced():
    with open(os.path.join(RESULTS, "fleet", "validation.json"), encoding="utf-8") as f:
        committed = json.load(f)
    run = "async_vs_sync_web16_fast_update"
    again = validate(RESULTS, lambda: get_config("tiny"), seed=committed["seed"], replicas=committed["replicas"],
                     updates=committed["long_run_updates"], only=(run,))
    assert again["calibration"] == committed["calibration"]   # the same measured JSON, the same numbers
    rows = [r for r in committed["rows"] if r["run"] == run]
    assert len(rows) == len(again["rows"]) == 3
    for old, new in zip(rows, again["rows"]):
        for key, value in old.items():
            if isinstance(value, float):
                assert new[key] == pytest.approx(value, rel=1e-9), key
            elif not isinstance(value, dict):
                assert new[key] == value, key


def test_accelerator_timing_reproduces_its_report():
    timing = AcceleratorTiming.from_results(RESULTS, "v5p-8")
    with open(os.path.join(RESULTS, "compile", "qwen3vl_8b_v5p-8.jsonl"), encoding="utf-8") as f:
        report = {r["program"]: r for r in map(json.loads, f)}
    train = report["train_step"]
    assert timing.train_s_per_token * train["rows"] * train["seq_len"] == pytest.approx(train["predicted_step_s"])
    decode = report["decode"]   # the report's own shape: weights + a full cache, HBM-bound
    full = timing.decode_weights_s + decode["rows"] * decode["cache_len"] * timing.decode_s_per_cache_token
    assert full == pytest.approx(decode["hbm_bytes_accessed"] / 2765e9)
    assert timing.params == pytest.approx(8.767e9, rel=1e-3)
    gpus = AcceleratorTiming.from_results(RESULTS, "h200x8")
    assert gpus.chips == 8 and gpus.train_s_per_token > timing.train_s_per_token   # 8.7% MFU measured vs roofline


def test_the_paper_regime_model_runs_and_keeps_its_rules():
    from jaxwebrl.plan.calibration import MachineCalibration
    from jaxwebrl.plan.planning import Workload, accelerator_params, compare

    config = get_config("qwen3vl_8b")
    config.env.latency.regime = "web"
    timing = AcceleratorTiming.from_results(RESULTS, "v5p-8")
    cal = MachineCalibration.from_results(RESULTS)
    both = compare(lambda mode: accelerator_params(config, timing, cal, Workload(), mode=mode, server="separate",
                                                   trainer_slices=4), seed=0, updates=3)
    assert both["async"]["staleness"]["max"] <= 2 and both["sync"]["staleness"]["max"] == 0
    assert both["async_over_sync"] > 1.0   # the trainer is not the limit at 4 slices: asynchrony pays
    with pytest.raises(ValueError, match="server='gpu0'"):
        accelerator_params(config, timing, cal, Workload(), mode="async", server="gpu0")
