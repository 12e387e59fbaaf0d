"""The paper's regime, predicted: 64 browsers on hosts of their own, the 8B recipe's trainer on an accelerator
slice and its policy server on an engine chip of its own, η = 2, batch 128, group 8, the paper's horizon mix.

    report = paper_regime(config, results_dir="docs/results")   # config: constT10.py:qwen3vl_8b

Per topology (v5p-8 from the AOT roofline, 8 H200s from the measured 2B step scaled to 8B): both modes,
async ÷ sync against two synchronous baselines (this repo's sync arm, which plays a group on every worker each
round and trains the first B trajectories, and one sized to its pool, B = W · G, which trains every group a round
plays, as the paper's does), the staleness distribution, the curve of trajectories an hour and trainer idle
against browsers per chip, the trainer slices it would take to reach the paper's asynchronous rate, and the same at
shorter responses (the engine's load).
"""

from __future__ import annotations

import dataclasses

from jaxwebrl.plan.accelerators import AcceleratorTiming
from jaxwebrl.plan.calibration import MachineCalibration
from jaxwebrl.plan.planning import Workload, accelerator_params, curve
from jaxwebrl.plan.fleet import simulate

PAPER = {"async_trajectories_per_hour": 3100, "sync_trajectories_per_hour": 1300, "async_over_sync": [2.4, 2.9]}
TOPOLOGIES = ("v5p-8", "h200x8")
CURVE_BROWSERS = (8, 16, 32, 64, 128)
TRAINER_SLICES = (1, 2, 4, 8)
RESPONSE_TOKENS = (64, 128)      # the engine's load, at 4 trainer slices (the response length is assumed)
KEYS = ("trajectories_per_hour", "seconds_per_step", "trainer_idle_fraction", "update_s_mean", "staleness",
        "dropped_stale", "server_busy_fraction", "server_mean_batch", "admission_wait_fraction")


def _arms(config, timing, cal, workload, *, seed: int, updates: int, trainer_slices: float = 1.0) -> dict:
    def run(mode: str, batch: int | None = None) -> dict:
        params = accelerator_params(config, timing, cal, workload, mode=mode, server="separate",
                                    trainer_slices=trainer_slices)
        if batch is not None:
            params = dataclasses.replace(params, batch=batch)
        result = simulate(params, seed, updates=updates)
        return {k: result[k] for k in KEYS}

    arms = {"async": run("async"), "sync": run("sync"),
            "sync_batch_is_pool": run("sync", int(config.rollout.num_workers) * int(config.env.group_size))}
    for arm in ("sync", "sync_batch_is_pool"):
        arms[f"async_over_{arm}"] = arms["async"]["trajectories_per_hour"] / arms[arm]["trajectories_per_hour"]
    return arms


def paper_regime(config, *, results_dir: str, seed: int = 0, updates: int = 12,
                 workload: Workload = Workload()) -> dict:
    config.env.latency.regime = "web"
    cal = MachineCalibration.from_results(results_dir)
    report = {"what": "the paper's regime predicted by the fleet model (jaxwebrl/plan)", "paper": PAPER,
              "browsers": int(config.rollout.num_workers), "group_size": int(config.env.group_size),
              "batch": int(config.train.consumer_batch_size), "eta": int(config.rollout.max_head_offpolicyness),
              "regime": "web", "seed": seed, "updates_simulated": updates,
              "workload": {**dataclasses.asdict(workload), "mean_steps": workload.episodes().mean_steps(),
                           "assumed": "success_p and response_tokens (not measured at this scale)"},
              "browser_step_s": cal.browser_step_s, "topologies": {}}
    for topology in TOPOLOGIES:
        timing = AcceleratorTiming.from_results(results_dir, topology, preset=str(config.model.preset))
        arms = _arms(config, timing, cal, workload, seed=seed, updates=updates)

        def make(n: int):
            config.rollout.num_workers = n
            return accelerator_params(config, timing, cal, workload, mode="async", server="separate")

        browsers = int(config.rollout.num_workers)
        points = curve(make, CURVE_BROWSERS, chips=timing.chips, seed=seed, updates=updates)
        config.rollout.num_workers = browsers
        scaling = []
        for k in TRAINER_SLICES:
            a = _arms(config, timing, cal, workload, seed=seed, updates=updates, trainer_slices=k)
            scaling.append({"trainer_slices": k, "async_trajectories_per_hour": a["async"]["trajectories_per_hour"],
                            "async_trainer_idle": a["async"]["trainer_idle_fraction"],
                            "server_busy": a["async"]["server_busy_fraction"],
                            "async_over_sync": a["async_over_sync"],
                            "async_over_sync_batch_is_pool": a["async_over_sync_batch_is_pool"]})
        shorter = []
        for tokens in RESPONSE_TOKENS:
            a = _arms(config, timing, cal, dataclasses.replace(workload, response_tokens=tokens), seed=seed,
                      updates=updates, trainer_slices=4)
            shorter.append({"response_tokens": tokens, "trainer_slices": 4,
                            "async_trajectories_per_hour": a["async"]["trajectories_per_hour"],
                            "server_busy": a["async"]["server_busy_fraction"],
                            "async_trainer_idle": a["async"]["trainer_idle_fraction"],
                            "async_over_sync": a["async_over_sync"],
                            "async_over_sync_batch_is_pool": a["async_over_sync_batch_is_pool"]})
        report["topologies"][topology] = {"timing": timing.to_json(), **arms, "curve": points,
                                          "trainer_slices": scaling, "response_tokens": shorter}
    return report
