"""What a deployment will do before it is rented: the fleet model on a recipe, a latency regime, a browser count
and a topology, and the smallest browser count that keeps the trainer busy.

    report = plan(config, results_dir="docs/results", topology="v5p-8", regime="web", browsers=64)
    report["async"]["trajectories_per_hour"], report["smallest_browsers_for_busy_trainer"]

Topologies: `cpu` is the calibrated measuring machine (everything shares its cores: the tiny default's own
measured inputs, validation.machine_params); an accelerator topology (accelerators.AcceleratorTiming) puts every
browser on a host of its own, the trainer on the slice (`trainer_slices` of them, data-parallel, ideal scaling)
and the policy server on one chip: `server="shared"` with the trainer (the default placement,
`distributed.server_devices=0`: both slow down while they overlap), `"reserved"` (`server_devices=1`: the
trainer loses that chip) or `"separate"` (an engine chip of its own, the paper's layout).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from jaxwebrl.plan.accelerators import AcceleratorTiming
from jaxwebrl.plan.calibration import MachineCalibration
from jaxwebrl.plan.fleet import EpisodeMix, FleetParams, simulate
from jaxwebrl.plan.validation import latency_config, machine_params

BUSY_TARGET = 0.9
SERVER_PLACEMENTS = ("shared", "reserved", "separate")
# A paper-scale step's prompt: (prompt_window + 1) rounds of one 1280x720 screenshot (880 image tokens,
# device_check_h200.json image_tokens_per_row) and its text (the rehearsal's measured 1,043-token one-screenshot
# prompt minus those 880; docs/scaling.md).
IMAGE_TOKENS_PER_SCREENSHOT = 880
TEXT_TOKENS_PER_ROUND = 1043 - 880


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a paper-scale episode is (the assumptions the report prints): the horizon mix and step counts of
    successes and failures, the success rate and the tokens a response takes."""

    horizons: tuple[int, ...] = (10, 20, 30)
    success_p: float = 0.35
    success_steps: float = 5.0
    failure_steps: float = 12.5
    response_tokens: int = 256

    def episodes(self) -> EpisodeMix:
        mean_horizon = sum(self.horizons) / len(self.horizons)
        return EpisodeMix(horizons=self.horizons, success_p=self.success_p, success_steps=self.success_steps,
                          failure_fraction=self.failure_steps / mean_horizon)


def accelerator_params(config, timing: AcceleratorTiming, cal: MachineCalibration, workload: Workload, *,
                       mode: str, server: str = "shared", trainer_slices: float = 1.0) -> FleetParams:
    """The model of `config` with its browsers on hosts of their own and trainer + server on `timing`'s slice."""
    prompt_tokens = (int(config.env.prompt_window) + 1) * (IMAGE_TOKENS_PER_SCREENSHOT + TEXT_TOKENS_PER_ROUND)
    row_tokens = prompt_tokens + workload.response_tokens
    batch_s = {b: timing.batch_s(requests=b, prompt_tokens=prompt_tokens, response_tokens=workload.response_tokens,
                                 row_tokens=row_tokens) for b in (1, 2)}
    if server not in SERVER_PLACEMENTS:
        raise ValueError(f"server={server!r}: use one of {SERVER_PLACEMENTS}")
    trainer_scale = (timing.chips / (timing.chips - 1) if server == "reserved" else 1.0) / trainer_slices
    shared = server == "shared"
    return FleetParams(
        workers=int(config.rollout.num_workers), group_size=int(config.env.group_size),
        batch=int(config.train.consumer_batch_size), eta=int(config.rollout.max_head_offpolicyness), mode=mode,
        dynamic_sampling=bool(config.train.dynamic_sampling), max_batch=int(config.rollout.server_max_batch),
        episodes=workload.episodes(), latency=latency_config(config),
        browser_step_s=cal.browser_step_s, browser_step_sigma=cal.browser_step_sigma, browser_cpu_fraction=1.0,
        server_s0=2 * batch_s[1] - batch_s[2], server_s1=batch_s[2] - batch_s[1], server_cores=1.0,
        update_s_per_row=timing.update_s(rows=1, row_tokens=row_tokens, epochs=int(config.train.ppo_n_epochs))
        * trainer_scale, trainer_cores=1.0, publish_s=timing.publish_s,
        pools=(("browsers", None), ("chip0", 1.0 if shared else None), ("trainer", None)),
        browser_pool="browsers", server_pool="chip0", trainer_pool="chip0" if shared else "trainer")


def compare(make: Callable[[str], FleetParams], *, seed: int, updates: int) -> dict:
    """Both modes of one setting, and async ÷ sync."""
    result = {mode: simulate(make(mode), seed, updates=updates) for mode in ("async", "sync")}
    result["async_over_sync"] = result["async"]["trajectories_per_hour"] / result["sync"]["trajectories_per_hour"]
    return result


def smallest_browsers(make: Callable[[int], FleetParams], *, seed: int, updates: int, target: float = BUSY_TARGET,
                      limit: int = 1024) -> dict:
    """The fewest browsers (multiples of 4 up to 32, of 16 up to 128, then of 64) at which the asynchronous
    trainer is busy at least `target` of the steady state, or why none up to `limit` is."""
    best = 0.0
    for n in (*range(4, 32, 4), *range(32, 128, 16), *range(128, limit + 1, 64)):
        result = simulate(make(n), seed, updates=updates)
        busy = 1.0 - result["trainer_idle_fraction"]
        if busy >= target:
            return {"browsers": n, "trainer_busy": busy, "target": target,
                    "trajectories_per_hour": result["trajectories_per_hour"]}
        best = max(best, busy)
    return {"browsers": None, "target": target, "why": f"the trainer stays below {target:.0%} busy up to {limit} "
                                                        f"browsers (at most {best:.0%}): the policy server or the "
                                                        f"admission capacity is the limit"}


def curve(make: Callable[[int], FleetParams], browsers: tuple[int, ...], *, chips: int, seed: int,
          updates: int) -> list[dict]:
    """Trajectories an hour and trainer idle (asynchronous mode) against browsers per accelerator chip."""
    rows = []
    for n in browsers:
        r = simulate(make(n), seed, updates=updates)
        rows.append({"browsers": n, "browsers_per_chip": n / chips, "trajectories_per_hour": r["trajectories_per_hour"],
                     "trainer_idle_fraction": r["trainer_idle_fraction"], "staleness_mean": r["staleness"]["mean"],
                     "server_busy_fraction": r["server_busy_fraction"]})
    return rows


def plan(config, *, results_dir: str, topology: str, regime: str, browsers: int, seed: int = 0, updates: int = 20,
         workload: Workload = Workload(), server: str = "shared", trainer_slices: float = 1.0,
         limit: int = 512) -> dict:
    """The planning report (module docstring): both modes at `browsers`, and the smallest count for a busy trainer.
    Sets `config`'s regime and browser count as it goes (the launcher's own copy)."""
    config.env.latency.regime = regime
    cal = MachineCalibration.from_results(results_dir)

    if topology == "cpu":
        timing = None

        def make(mode: str, n: int) -> FleetParams:
            config.rollout.num_workers = n
            return machine_params(config, cal, mode)
    else:
        timing = AcceleratorTiming.from_results(results_dir, topology, preset=str(config.model.get("preset") or ""))

        def make(mode: str, n: int) -> FleetParams:
            config.rollout.num_workers = n
            return accelerator_params(config, timing, cal, workload, mode=mode, server=server,
                                      trainer_slices=trainer_slices)

    both = compare(lambda mode: make(mode, browsers), seed=seed, updates=updates)
    keys = ("trajectories_per_hour", "seconds_per_step", "trainer_idle_fraction", "update_s_mean", "staleness",
            "dropped_stale", "dropped_uniform_groups", "server_busy_fraction", "server_mean_batch",
            "admission_wait_fraction")
    return {
        "what": "fleet model prediction (jaxwebrl/plan)", "variant": config.get("variant"), "topology": topology,
        "regime": regime, "browsers": browsers, "group_size": int(config.env.group_size),
        "batch": int(config.train.consumer_batch_size), "eta": int(config.rollout.max_head_offpolicyness),
        "server": server if timing else "shared (one machine)", "trainer_slices": trainer_slices,
        "seed": seed, "updates_simulated": updates,
        "async": {k: both["async"][k] for k in keys}, "sync": {k: both["sync"][k] for k in keys},
        "async_over_sync": both["async_over_sync"],
        "smallest_browsers_for_busy_trainer": smallest_browsers(lambda n: make("async", n), seed=seed,
                                                                updates=updates, limit=limit),
        "inputs": {"machine": cal.to_json(), "accelerator": timing.to_json() if timing else None,
                   "workload": dataclasses.asdict(workload) if timing else "the calibrated tiny episodes"},
    }
