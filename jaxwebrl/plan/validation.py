"""The fleet model against every measured async/sync run (docs/results/live_loop/async_vs_sync_*.json).

    report = validate("docs/results", lambda: constT10.get_config("tiny"), seed=0)
    report["rows"]    # per run and arm: measured vs predicted trajectories an hour, idle, staleness, ratio

Each run's own recipe (the config the bench built: the variant, `num_workers`, the regime, its `overrides`) gives
the model's shape; the machine's timings come from calibration.MachineCalibration. Runs made before the update got
faster (every file without `fast_update` in its name) train `MachineCalibration.slow_update_factor` times slower a
row.
"""

from __future__ import annotations

import ast
from typing import Callable

import numpy as np

from jaxwebrl.env.latency import LatencyConfig
from jaxwebrl.plan.calibration import SERVER_CORES, TRAINER_CORES, MachineCalibration, live_loop_runs
from jaxwebrl.plan.fleet import EpisodeMix, FleetParams, simulate

# docs/live_loop.md "The rebuilt pool": a new Chromium session and its first page, 1.2-1.5 s (five starts, alone).
RESTART_S = 1.35
ARMS = {"sync": ("sync", False), "sync_rebuilt": ("sync", True), "async": ("async", False)}
WITHIN = 0.15
REPLICAS = 8          # model runs of each bench's own length, averaged
LONG_UPDATES = 40     # and one long run for the steady state


def apply_overrides(config, overrides: list[str]):
    """`--config.a.b=v` strings (as the bench records them) set on `config`; values parsed as Python literals."""
    for item in overrides:
        key, _, text = item.removeprefix("--config.").partition("=")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        *path, leaf = key.split(".")
        node = config
        for part in path:
            node = getattr(node, part)
        setattr(node, leaf, value)
    return config


def latency_config(config) -> LatencyConfig:
    """The run's env.latency as the env builds it, checked as validation checks it (LatencyConfig.for_run names a
    bad field)."""
    return LatencyConfig.for_run(config.env.latency.to_dict(), config.env.step_timeout_s)


def machine_params(config, cal: MachineCalibration, arm: str, *, update_factor: float = 1.0) -> FleetParams:
    """The model of `config` run on the calibrated machine (everything shares its cores), for one bench arm."""
    mode, rebuilt = ARMS[arm]
    if config.rollout.get("server_deadline_ms", 0.0):
        raise ValueError(f"rollout.server_deadline_ms={config.rollout.server_deadline_ms!r}: the fleet model batches "
                         f"whatever is queued (deadline 0, the default); set it to 0")
    horizon = int(config.env.max_episode_steps)
    return FleetParams(
        workers=int(config.rollout.num_workers), group_size=int(config.env.group_size),
        batch=int(config.train.consumer_batch_size), eta=int(config.rollout.max_head_offpolicyness), mode=mode,
        dynamic_sampling=bool(config.train.dynamic_sampling), max_batch=int(config.rollout.server_max_batch),
        episodes=EpisodeMix(horizons=(horizon,), success_p=cal.success_p, success_steps=cal.success_steps,
                            failure_fraction=cal.failure_fraction),
        latency=latency_config(config), browser_step_s=cal.browser_step_s, browser_step_sigma=cal.browser_step_sigma,
        browser_cpu_fraction=cal.browser_cpu_fraction, restart_s=RESTART_S if rebuilt else 0.0,
        server_s0=cal.server_s0, server_s1=cal.server_s1, server_cores=SERVER_CORES,
        update_s_per_row=cal.update_s_per_row * update_factor, trainer_cores=TRAINER_CORES,
        pools=(("host", cal.cores),), browser_pool="host", server_pool="host", trainer_pool="host")


def _close(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else predicted / measured


def predict_run(params: FleetParams, measured: dict, *, seed: int, replicas: int, updates: int) -> dict:
    """The model's answer to what the bench measured: `replicas` runs of the bench's own length (its train steps,
    the first excluded) averaged, their spread, and one long run (`updates` steps) for the steady state."""
    steps = int(measured["train_steps"])
    short = [simulate(params, seed * 1000 + r, updates=steps) for r in range(replicas)]
    long = simulate(params, seed * 1000 + replicas, updates=updates)
    rates = np.array([s["trajectories_per_hour"] for s in short])
    return {
        "trajectories_per_hour": float(rates.mean()),
        "trajectories_per_hour_spread": float(rates.std()),
        "trainer_idle_as_counted": float(np.mean([s["trainer_idle_fraction_as_counted"] for s in short])),
        "staleness_mean": float(np.mean([s["staleness"]["mean"] for s in short])),
        "staleness_max": int(max(s["staleness"]["max"] for s in short)),
        "dropped_stale_per_update": float(np.mean([s["dropped_stale"] / s["updates"] for s in short])),
        "long_run": {k: long[k] for k in ("trajectories_per_hour", "trainer_idle_fraction", "staleness",
                                          "seconds_per_step", "update_s_mean", "server_busy_fraction",
                                          "server_mean_batch", "admission_wait_fraction")},
    }


def validate(results_dir: str, make_config: Callable[[], object], *, seed: int = 0, replicas: int = REPLICAS,
             updates: int = LONG_UPDATES, only: tuple[str, ...] | None = None) -> dict:
    """Predicted vs measured for every arm of every async_vs_sync run (or the runs named in `only`); `misses`
    lists what is off by more than ±15%."""
    cal = MachineCalibration.from_results(results_dir)
    rows = []
    for name, run in live_loop_runs(results_dir).items():
        if only is not None and name not in only:
            continue
        config = apply_overrides(make_config(), list(run.get("overrides", [])))
        config.rollout.num_workers = int(run["num_workers"])
        config.env.latency.regime = run["regime"]
        factor = 1.0 if "fast_update" in name else cal.slow_update_factor
        predicted = {}
        for arm in (a for a in ARMS if a in run):
            measured = run[arm]
            result = predict_run(machine_params(config, cal, arm, update_factor=factor), measured, seed=seed,
                                 replicas=replicas, updates=updates)
            predicted[arm] = result
            row = {
                "run": name, "arm": arm, "regime": run["regime"], "browsers": run["num_workers"],
                "batch": int(config.train.consumer_batch_size), "dynamic_sampling": bool(config.train.dynamic_sampling),
                "update": "fast" if factor == 1.0 else "slow", "steady_state_steps": measured["steady_state_steps"],
                "measured_trajectories_per_hour": measured["trajectories_per_hour"],
                "predicted_trajectories_per_hour": result["trajectories_per_hour"],
                "predicted_spread": result["trajectories_per_hour_spread"],
                "predicted_over_measured": _close(result["trajectories_per_hour"], measured["trajectories_per_hour"]),
                "measured_trainer_idle": measured["trainer_idle_fraction"],
                "predicted_trainer_idle": result["trainer_idle_as_counted"],
                "measured_staleness_mean": measured["mean_staleness"],
                "predicted_staleness_mean": result["staleness_mean"],
                "measured_staleness_max": measured["max_staleness"],
                "predicted_staleness_max": result["staleness_max"],
                "measured_dropped_stale_per_update": measured["dropped_stale"] / measured["train_steps"],
                "predicted_dropped_stale_per_update": result["dropped_stale_per_update"],
                "long_run": result["long_run"],
            }
            rows.append(row)
        for arm in (a for a in predicted if a != "async"):
            key = f"steady_state_ratio_async_over_{arm}"
            p_ratio = predicted["async"]["trajectories_per_hour"] / predicted[arm]["trajectories_per_hour"]
            long_ratio = (predicted["async"]["long_run"]["trajectories_per_hour"]
                          / predicted[arm]["long_run"]["trajectories_per_hour"])
            rows.append({"run": name, "arm": f"async / {arm}", "regime": run["regime"],
                         "browsers": run["num_workers"], "measured_ratio": run.get(key), "predicted_ratio": p_ratio,
                         "predicted_over_measured": _close(p_ratio, run.get(key)), "long_run_ratio": long_ratio})
    return {"what": "fleet model (jaxwebrl/plan) vs every async_vs_sync measurement", "seed": seed,
            "replicas": replicas, "long_run_updates": updates, "within": WITHIN, "calibration": cal.to_json(),
            "assumptions": {"restart_s": RESTART_S},
            "rows": rows, "misses": misses(rows)}


def misses(rows: list[dict]) -> list[str]:
    """The rows whose prediction is off its measurement by more than ±15%, one line each."""
    out = []
    for r in rows:
        ratio = r["predicted_over_measured"]
        if ratio is not None and abs(ratio - 1) > WITHIN:
            what = "ratio" if "measured_ratio" in r else "trajectories/h"
            out.append(f"{r['run']} {r['arm']}: {what} predicted {ratio:.2f}x measured")
    return out
