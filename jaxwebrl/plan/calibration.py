"""The fleet model's inputs, read from the JSON the benches print (docs/results/), never typed in.

    cal = MachineCalibration.from_results("docs/results")   # this 2-core machine: browsers, server, trainer
    cal.to_json()                                            # every number with where it came from

Measured inputs and how each becomes a model parameter (a mean-value fit of processor sharing, engine.py):
- cores: from an async_vs_sync run's CPU seconds a trajectory (= busy · cores · span / trajectories);
- the worker's own time a step, alone: `rollout_after.json` at 2 workers (cycle = 2 · window / steps, minus the
  server's mean batch time and median queue), taken as uncontended (checked: demand below the cores);
- the CPU part of it and the server's batch cost `s0 + s1 · b`: the same bench at 8 workers, where the cores are
  saturated: the common speed σ solves `n · f · w / cycle + server_busy · σ = cores` with
  `f = (w8 / w − 1) / (1 / σ − 1)`, and the server's alone time at b8 is its measured batch time × σ;
- the update's seconds a row, alone: `updates_per_minute_tiny.json` (busy = s/update · (1 − idle) per run, over
  its mean rows), times the speed the trainer had next to its 2 workers (σ = cores / (trainer + their demand));
- the update before it got faster: that file's previous round of seconds an update over this round's;
- episode lengths: the random-init tiny policy's own (learning_run.json `initial`: steps a success, a failure);
- the success rate: from the async_vs_sync runs' drop counts (uniform groups / groups judged = p^G + (1 − p)^G);
  a calibration on the validated runs' counts, not their times.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os

# The recipe every calibration run was measured on (configs/constT10.py:tiny; tests/plan check they agree): the
# drop counts solve the success rate with ITS group size and the episode lengths are fractions of ITS horizon,
# whatever recipe a plan is then made for.
EVIDENCE_VARIANT, EVIDENCE_GROUP_SIZE, EVIDENCE_HORIZON = "tiny", 4, 5
TRAINER_CORES = 2.0    # JAX's CPU client runs one intra-op pool over every core (docs/live_loop.md, placement)
SERVER_CORES = 1.0     # the policy server's batching thread


def load_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def live_loop_runs(results_dir: str) -> dict[str, dict]:
    """Every async_vs_sync_*.json under results_dir/live_loop, by file stem."""
    paths = sorted(glob.glob(os.path.join(results_dir, "live_loop", "async_vs_sync_*.json")))
    if not paths:
        raise FileNotFoundError(f"no async_vs_sync_*.json under {results_dir}/live_loop: pass the repo's "
                                f"docs/results (--results_dir)")
    return {os.path.basename(p)[:-5]: load_json(p) for p in paths}


def cores_from_runs(runs: dict[str, dict]) -> tuple[float, str]:
    """The measuring machine's cores, from the first arm that reports CPU seconds a trajectory."""
    for name, run in runs.items():
        for arm in ("sync", "async"):
            m = run.get(arm, {})
            if m.get("cpu_seconds_per_trajectory") and m.get("cpu_busy_fraction"):
                span = m["seconds_per_step"] * m["steady_state_steps"]
                trajectories = m["trajectories_per_hour"] * span / 3600.0
                cores = m["cpu_seconds_per_trajectory"] * trajectories / (m["cpu_busy_fraction"] * span)
                return float(round(cores)), f"{name}.{arm}: cpu_seconds_per_trajectory x trajectories / (busy x span)"
    raise ValueError("no async_vs_sync run reports cpu_seconds_per_trajectory: rerun bench/async_vs_sync.py")


def _bisect(g, lo: float, hi: float, iters: int = 100) -> float:
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if g(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def solve_success_rate(uniform_fraction: float, group_size: int) -> float:
    """p <= 0.5 with p^G + (1 − p)^G = uniform_fraction (the share of groups all success or all failure)."""
    floor = 2 * 0.5 ** group_size
    if not floor <= uniform_fraction <= 1:
        raise ValueError(f"uniform group fraction {uniform_fraction:.3f} is below 2 / 2^G = {floor:.3f}: no "
                         f"success rate gives it")
    return _bisect(lambda p: uniform_fraction - (p ** group_size + (1 - p) ** group_size), 0.0, 0.5)


def _rollout_point(result: dict) -> dict:
    n = result["num_workers"]
    cycle = n * result["window_s"] / result["steps"]
    batch = result["server"]["busy_s"] / result["server"]["batches"]
    return {"workers": n, "cycle_s": cycle, "batch_s": batch, "queue_s": result["median_s"]["queue_s"],
            "own_s": cycle - batch - result["median_s"]["queue_s"],
            "mean_batch": result["server"]["requests"] / result["server"]["batches"],
            "server_busy": result["server_busy_fraction"],
            "env_step_sigma": math.log(result["p90_s"]["env_step_s"] / result["median_s"]["env_step_s"]) / 1.2816}


@dataclasses.dataclass(frozen=True)
class MachineCalibration:
    """This machine's measured loop as model parameters (module docstring); `sources` says where each came from."""

    cores: float
    browser_step_s: float
    browser_step_sigma: float
    browser_cpu_fraction: float
    server_s0: float
    server_s1: float
    update_s_per_row: float
    success_p: float
    success_steps: float
    failure_fraction: float
    slow_update_factor: float
    sources: dict

    @classmethod
    def from_results(cls, results_dir: str) -> "MachineCalibration":
        runs = live_loop_runs(results_dir)
        group_size, horizon = EVIDENCE_GROUP_SIZE, EVIDENCE_HORIZON
        for name, run in runs.items():
            changed = [o for o in run.get("overrides") or [] if o.startswith(("--config.env.group_size=",
                                                                              "--config.env.max_episode_steps="))]
            if run.get("variant") != EVIDENCE_VARIANT or changed:
                raise ValueError(f"live_loop/{name}.json was measured on variant {run.get('variant')!r} "
                                 f"{' '.join(changed)}: the calibration reads runs of the {EVIDENCE_VARIANT!r} "
                                 f"recipe (G = {group_size}, horizon {horizon}); move the file out of live_loop/")
        cores, cores_from = cores_from_runs(runs)
        bench = load_json(os.path.join(results_dir, "live_loop", "rollout_after.json"))["results"]
        points = sorted((_rollout_point(r) for r in bench), key=lambda r: r["workers"])
        if len(points) < 2:
            raise ValueError("rollout_after.json needs two pool sizes (an uncontended and a saturated one): rerun "
                             "bench/rollout.py --workers=2,8")
        low, high = points[0], points[-1]
        w = low["own_s"]
        k = high["workers"] * (high["own_s"] - w) / high["cycle_s"]
        sigma = _bisect(lambda s: k * s / (1 - s) + high["server_busy"] * SERVER_CORES * s - cores, 1e-6, 1 - 1e-9)
        f = min(1.0, (high["own_s"] / w - 1) / (1 / sigma - 1))
        s1 = (high["batch_s"] * sigma - low["batch_s"]) / (high["mean_batch"] - low["mean_batch"])
        s0 = low["batch_s"] - s1 * low["mean_batch"]
        low_demand = low["workers"] * f * w / low["cycle_s"] + low["server_busy"] * SERVER_CORES
        if low_demand > cores:
            raise ValueError(f"rollout_after.json at {low['workers']} workers already saturates {cores:g} cores "
                             f"(demand {low_demand:.2f}): measure a smaller pool for the alone times")
        updates = load_json(os.path.join(results_dir, "live_loop", "updates_per_minute_tiny.json"))
        trainer_speed = min(1.0, cores / (TRAINER_CORES + low_demand))
        per_row = [r["s_per_update"] * (1 - r["trainer_idle_fraction_at_end"]) * trainer_speed
                   / (sum(r["rows"]) / len(r["rows"])) for r in updates["runs"]]
        previous = updates["previous_round_s_per_update"]
        slow = sum(previous) / len(previous) / updates["s_per_update_mean"]
        judged = uniform = 0
        for run in runs.values():
            if "--config.train.dynamic_sampling=False" in run.get("overrides", []):
                continue
            for arm in ("sync", "sync_rebuilt", "async"):
                if arm in run:
                    uniform += run[arm]["dropped_uniform_groups"]
                    judged += run[arm]["dropped_uniform_groups"] + run[arm]["trained_trajectories"] / group_size
        p = solve_success_rate(uniform / judged, group_size)
        initial = load_json(os.path.join(results_dir, "learning_run.json"))["initial"]
        return cls(
            cores=cores, browser_step_s=w, browser_step_sigma=low["env_step_sigma"], browser_cpu_fraction=f,
            server_s0=s0, server_s1=s1, update_s_per_row=sum(per_row) / len(per_row), success_p=p,
            success_steps=initial["steps_success"], failure_fraction=initial["steps_failure"] / horizon,
            slow_update_factor=slow,
            sources={
                "cores": cores_from,
                "browser_step_s": f"rollout_after.json, {low['workers']} workers: cycle {low['cycle_s']:.4f} s - "
                                  f"server batch {low['batch_s']:.4f} s - queue {low['queue_s']:.4f} s "
                                  f"(demand {low_demand:.2f} of {cores:g} cores: uncontended)",
                "browser_step_sigma": "rollout_after.json: ln(p90 / median) of env_step_s / z_0.9",
                "browser_cpu_fraction": f"rollout_after.json, {high['workers']} workers: saturated, common speed "
                                        f"{sigma:.3f} (processor-sharing mean-value fit)",
                "server_s0_s1": f"server batch {low['batch_s'] * 1e3:.1f} ms at b={low['mean_batch']:.2f} alone, "
                                f"{high['batch_s'] * 1e3:.1f} ms x speed {sigma:.3f} at b={high['mean_batch']:.2f}",
                "update_s_per_row": f"updates_per_minute_tiny.json: s/update x (1 - idle) x trainer speed "
                                    f"{trainer_speed:.2f} next to 2 workers / mean rows, mean of "
                                    f"{len(per_row)} runs (compiling updates included)",
                "success_p": f"async_vs_sync runs with dynamic sampling: {uniform:g} uniform of {judged:g} groups "
                             f"judged = p^G + (1 - p)^G, G = {group_size} (counts of the validated runs)",
                "slow_update_factor": f"updates_per_minute_tiny.json: previous round's s/update {previous} over "
                                      f"this round's mean {updates['s_per_update_mean']} (the runs made before the "
                                      f"update got faster)",
                "episode_steps": f"learning_run.json initial (the random-init tiny policy, before SFT): "
                                 f"{initial['steps_success']:.2f} steps a success, {initial['steps_failure']:.2f} "
                                 f"a failure of horizon {horizon}",
            })

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
