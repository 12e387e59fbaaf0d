"""launch/plan.py on the tiny default's own measured inputs, its one-line errors, and the committed fleet JSON
(every validation run, its misses, the paper regime's arms and, in a slow test, its whole report) reproduced by the
code that wrote it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from configs.constT10 import get_config
from jaxwebrl.plan.accelerators import AcceleratorTiming
from jaxwebrl.plan.validation import WITHIN, misses, validate

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


def test_the_calibration_reads_its_runs_with_their_own_recipe_not_the_planned_one(tmp_path):
    """The drop counts solve the success rate with the measured runs' G (the tiny recipe's 4), never the planned
    recipe's (the 8B recipe's G = 8 once turned 10.5% into 3%); a run of another recipe is refused by name."""
    from jaxwebrl.plan import calibration
    tiny = get_config("tiny")
    assert (calibration.EVIDENCE_GROUP_SIZE, calibration.EVIDENCE_HORIZON) == (tiny.env.group_size,
                                                                               tiny.env.max_episode_steps)
    cal = calibration.MachineCalibration.from_results(RESULTS)
    assert "G = 4" in cal.sources["success_p"] and cal.success_p == pytest.approx(0.105, abs=0.005)
    shutil.copytree(RESULTS, tmp_path / "results")
    run = tmp_path / "results" / "live_loop" / "async_vs_sync_web.json"
    run.write_text(json.dumps({**json.loads(run.read_text()), "overrides": ["--config.env.group_size=8"]}))
    with pytest.raises(ValueError, match="async_vs_sync_web.json was measured on variant 'tiny' --config.env.group"):
        calibration.MachineCalibration.from_results(str(tmp_path / "results"))


def _committed(name: str) -> dict:
    with open(os.path.join(RESULTS, "fleet", name), encoding="utf-8") as f:
        return json.load(f)


VALIDATION = _committed("validation.json")


def _same(old, new, path: str = "") -> list:
    """Where `new` differs from `old` (floats to 1e-9 relative): one 'path: old != new' each."""
    if isinstance(old, dict) and isinstance(new, dict) and set(old) == set(new):
        return [p for k in old for p in _same(old[k], new[k], f"{path}.{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new)) for p in _same(a, b, f"{path}[{i}]")]
    if isinstance(old, float) and isinstance(new, (int, float)):
        return [] if new == pytest.approx(old, rel=1e-9) else [f"{path}: {old} != {new}"]
    return [] if old == new else [f"{path}: {old!r:.60} != {new!r:.60}"]


@pytest.mark.parametrize("run", sorted({r["run"] for r in VALIDATION["rows"]}))
def test_every_committed_validation_run_is_reproduced(run):
    """The model's predictions for each measured run (every arm, its ratios, its long run) are planner arithmetic on
    the committed measurements: recomputed, they equal the committed rows."""
    again = validate(RESULTS, lambda: get_config("tiny"), seed=VALIDATION["seed"], replicas=VALIDATION["replicas"],
                     updates=VALIDATION["long_run_updates"], only=(run,))
    assert again["calibration"] == VALIDATION["calibration"]   # the same measured JSON, the same numbers
    rows = [r for r in VALIDATION["rows"] if r["run"] == run]
    problems = _same(rows, json.loads(json.dumps(again["rows"])))
    assert rows and not problems, f"{run}: " + "; ".join(problems[:6])


def test_the_committed_misses_are_its_rows_off_by_more_than_15_percent():
    assert VALIDATION["within"] == WITHIN
    assert VALIDATION["misses"] == misses(VALIDATION["rows"])
    off = dict(VALIDATION["rows"][0], predicted_over_measured=1 + 2 * WITHIN)
    assert misses([off]) == [f"{off['run']} {off['arm']}: trajectories/h predicted {1 + 2 * WITHIN:.2f}x measured"]


PAPER_REGIME = _committed("paper_regime.json")


def _paper_inputs():
    from jaxwebrl.plan.calibration import MachineCalibration

    config = get_config("qwen3vl_8b")
    config.env.latency.regime = "web"
    return config, MachineCalibration.from_results(RESULTS)


@pytest.mark.parametrize("topology", sorted(PAPER_REGIME["topologies"]))
def test_the_paper_regimes_headline_arms_are_reproduced(topology):
    """Each topology's three arms (async, sync, sync with its pool as the batch) and the async ÷ sync ratios README
    and docs/fleet_model.md quote, recomputed; and every ratio in the JSON is its own arms' quotient."""
    from jaxwebrl.plan.paper import _arms
    from jaxwebrl.plan.planning import Workload

    config, cal = _paper_inputs()
    committed = PAPER_REGIME["topologies"][topology]
    timing = AcceleratorTiming.from_results(RESULTS, topology, preset=str(config.model.preset))
    assert committed["timing"]["sources"]["report"].endswith(timing.sources["report"])
    assert _same({**committed["timing"], "sources": None}, {**json.loads(json.dumps(timing.to_json())),
                                                              "sources": None}) == []
    arms = json.loads(json.dumps(_arms(config, timing, cal, Workload(), seed=PAPER_REGIME["seed"],
                                       updates=PAPER_REGIME["updates_simulated"])))
    problems = _same({k: committed[k] for k in arms}, arms)
    assert not problems, f"{topology}: " + "; ".join(problems[:6])
    for arm in ("sync", "sync_batch_is_pool"):
        assert committed[f"async_over_{arm}"] == pytest.approx(
            committed["async"]["trajectories_per_hour"] / committed[arm]["trajectories_per_hour"], rel=1e-12)


@pytest.mark.slow   # the whole report: 26 simulations a topology, ~15 s alone, ~40 s on a busy 2-core machine
def test_the_committed_paper_regime_is_reproduced_whole():
    from jaxwebrl.plan.paper import paper_regime

    again = json.loads(json.dumps(paper_regime(get_config("qwen3vl_8b"), results_dir=RESULTS,
                                               seed=PAPER_REGIME["seed"])))
    committed = json.loads(json.dumps(PAPER_REGIME))
    for topology, record in committed["topologies"].items():   # written before the path was made relative
        assert record["timing"]["sources"]["report"].endswith(again["topologies"][topology]["timing"]["sources"]
                                                              ["report"])
        record["timing"]["sources"]["report"] = again["topologies"][topology]["timing"]["sources"]["report"]
    problems = _same(committed, again)
    assert not problems, "; ".join(problems[:6])


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


# bench/device_check.sh --tiny's own output (CPU, at 77c384e): the layout the next device run writes, with its
# parts (train_new, train_old, ..., decode's variants, prefill) where the 30 Nov run had train_step and decode alone
DEVICE_CHECK_TINY = os.path.join(REPO, "tests", "data", "device_check_tiny_cpu.json")


def _gpu_timing(tmp_path, device: dict) -> AcceleratorTiming:
    """The h200x8 timing on the committed AOT report beside `device` as the H200's device check."""
    from jaxwebrl.plan.accelerators import GPU_CHECKS

    (tmp_path / "compile").mkdir(exist_ok=True)
    shutil.copy(os.path.join(RESULTS, "compile", "qwen3vl_8b_v5p-8.jsonl"), tmp_path / "compile")
    check = tmp_path / GPU_CHECKS["h200"]
    check.parent.mkdir(parents=True, exist_ok=True)
    check.write_text(json.dumps(device))
    return AcceleratorTiming.from_results(str(tmp_path), "h200x8")


def test_the_gpu_timing_reads_the_device_checks_current_layout(tmp_path):
    """The fastest train part with screenshots a token (never the text-only rows, here made the fastest), the
    server's decode variant (not the part's top level, the last variant run), the measured prefill, each scaled to
    8B as the 30 Nov layout is; without a prefill part, the quarter rule; without a measured train step, one line."""
    from jaxwebrl.plan.accelerators import SERVER_DECODE_VARIANT

    with open(DEVICE_CHECK_TINY, encoding="utf-8") as f:
        device = json.load(f)
    device["train_new_text"]["measured_step_s"] = device["train_new"]["measured_step_s"] / 10
    device["decode"]["measured_step_s"] *= 2          # a top level that is not the server's variant
    timing = _gpu_timing(tmp_path, device)
    with open(os.path.join(RESULTS, "compile", "qwen3vl_8b_v5p-8.jsonl"), encoding="utf-8") as f:
        aot = {r["program"]: r for r in map(json.loads, f)}
    screenshot_parts = [device[k] for k in ("train_new", "train_old", "train_new_full_remat")]
    step = min(screenshot_parts, key=lambda r: r["measured_step_s"] / (r["rows"] * r["seq_len"]))
    per_token = lambda r, n: r["model_flops"] / (r["rows"] * r[n])   # noqa: E731
    one_gpu = (step["measured_step_s"] / (step["rows"] * step["seq_len"])
               * (aot["train_step"]["model_flops"] / aot["train_step"]["seq_len"]) / per_token(step, "seq_len"))
    assert timing.train_s_per_token == pytest.approx(one_gpu / 8, rel=1e-12)
    prefill = device["prefill"]
    assert timing.prefill_s_per_token == pytest.approx(
        prefill["measured_step_s"] / (prefill["rows"] * prefill["prompt_len"])
        * per_token(aot["prefill"], "prompt_len") / per_token(prefill, "prompt_len"), rel=1e-12)
    assert timing.decode_weights_s == pytest.approx(
        device["decode"]["variants"][SERVER_DECODE_VARIANT]["measured_step_s"] * timing.params / step["params"])
    del device["prefill"]
    assert _gpu_timing(tmp_path, device).prefill_s_per_token == pytest.approx(one_gpu / 4, rel=1e-12)
    for name in ("train_new", "train_old", "train_new_full_remat"):
        device[name] = {"program": name, "error": "timed out"}
    with pytest.raises(ValueError, match="no measured train step"):
        _gpu_timing(tmp_path, device)


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
