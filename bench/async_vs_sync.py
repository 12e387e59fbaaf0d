r"""Asynchronous vs synchronous training throughput, side by side in one run; prints one JSON object.

Same recipe, variant, workers and latency regime for both modes, one after the other: the synchronous baseline
(`rollout.mode=sync`: one batch of groups is admitted per policy version and played to the end, stragglers
included; generation stops while the trainer trains; only the current version's episodes train: staleness 0), then
the paper's asynchronous mode (up to η + 1 batches in flight or waiting, rollout/admission.py). Each mode runs until it has made `--steps` train steps after
its first (which compiles the update and is excluded from the steady state): the window is counted in steps, not
seconds. `--max_minutes` is only a safety net; an arm it stops gets a `needs` line saying how long to rerun.

Regimes (`--regime`): `local` serves MiniWoB++ pages from disk, so they answer at once; `web` models real websites
(`env.latency.regime=web`: a lognormal page delay per reset and step, median 0.8 s and p95 5 s, and Chromium's
network throttled to DevTools' "Fast 4G"; docs/env.md), which is where asynchrony pays.

Arms (`--arms`, run in the order given): `sync` and `async` as above, both on the everlasting browser pool, so
their ratio is what asynchrony alone buys; `sync_rebuilt` is the paper's own synchronous baseline (WebGym's pool,
rebuilt every iteration: `rollout.fresh_envs_per_group`, every group starts new browser sessions), so async over it
is what the paper's 2.4x compares (everlasting pool + asynchrony).

Reported per mode: steady-state trajectories per hour (trained trajectories after the first step over the time since
it), train steps, trainer idle fraction, the machine's CPU busy fraction over the steady state and the CPU seconds a
trained trajectory cost (all cores, /proc/stat), mean and max staleness of the trained episodes, episodes dropped as stale,
and the exactly-once audit (every trained episode id is in the buffer's commit log, none trained twice). The ratio
async/sync is printed only when both modes made at least `MIN_STEPS` steady-state steps; otherwise it is null and
`needs` says how to rerun (more `--steps`, or more minutes for an arm the clock stopped).

    python bench/async_vs_sync.py --regime=web --num_workers=8
    python bench/async_vs_sync.py --regime=web --num_workers=16 --arms=sync_rebuilt,sync,async
    python bench/async_vs_sync.py --regime=web --num_workers=16 -- --config.train.consumer_batch_size=64
    python bench/async_vs_sync.py --regime=local --variant=toy --steps=8
"""

import argparse
import json
import os
import tempfile
import threading
import time

from rollout import apply_overrides   # bench/rollout.py

MIN_STEPS = 5   # steady-state train steps per mode below which no ratio is printed


class CpuBusy:
    """Samples the machine's CPU counters (/proc/stat) once a second on a thread; `fraction(t0, t1)` is the share of
    all cores' time spent busy (not idle or waiting on I/O) between wall times t0 and t1, or None without /proc.
    With the steady state's wall time and trajectories it gives the CPU seconds a trained trajectory cost: whether an
    arm is faster by filling idle cores or by doing less work."""

    def __init__(self, period_s: float = 1.0):
        self.samples: list[tuple[float, int, int]] = []   # (wall time, total jiffies, idle jiffies)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        if self._read() is not None:
            self._thread.start()

    @staticmethod
    def _read():
        try:
            with open("/proc/stat", encoding="ascii") as f:
                counters = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return time.time(), sum(counters), counters[3] + counters[4]   # idle + iowait

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            sample = self._read()
            if sample is not None:
                self.samples.append(sample)
            self._stop.wait(period_s)

    def fraction(self, t0: float, t1: float) -> float | None:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2 or inside[-1][1] == inside[0][1]:
            return None
        first, last = inside[0], inside[-1]
        return 1.0 - (last[2] - first[2]) / (last[1] - first[1])

    def close(self) -> None:
        self._stop.set()
ARMS = {"sync": ("sync", False), "sync_rebuilt": ("sync", True), "async": ("async", False)}   # (mode, fresh pool)


def measure(arm: str, args, root: str) -> dict:
    from configs.constT10 import get_config
    from jaxwebrl.buffer.ring import RingBuffer
    from jaxwebrl.train import supervisor
    from jaxwebrl.train.config_validation import validate
    from jaxwebrl.train.metrics import read_metrics

    mode, fresh_envs = ARMS[arm]
    config = get_config(args.variant)
    config.rollout.mode = mode
    config.rollout.fresh_envs_per_group = fresh_envs
    apply_overrides(config, args.override)
    config.rollout.num_workers = args.num_workers
    config.env.latency.regime = args.regime
    config.train.max_steps = args.steps + 1          # + the first step (compiles; outside the steady state)
    config.metrics.progress_bar = False
    config.metrics.tensorboard = False
    config.checkpoint.save_every_steps = 10**6       # no checkpoint I/O inside the measured window
    workdir = os.path.join(root, arm)
    validate(config, workdir)
    stop = threading.Event()
    timer = threading.Timer(args.max_minutes * 60, stop.set)
    start = time.monotonic()
    timer.start()
    cpu = CpuBusy()
    try:
        supervisor.run(config, workdir, stop=stop)
    finally:
        timer.cancel()
        cpu.close()
    wall = time.monotonic() - start
    records = read_metrics(workdir) if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else []
    last = records[-1] if records else {}
    steady_steps = max(len(records) - 1, 0)
    steady = busy = cpu_per_trajectory = None
    if steady_steps:
        busy = cpu.fraction(records[0]["time"], records[-1]["time"])
        span = records[-1]["time"] - records[0]["time"]
        trajectories = sum(r["ppo_actor/trajectories"] for r in records[1:])
        steady = trajectories / span * 3600.0 if span > 0 else None
        cpu_per_trajectory = busy * (os.cpu_count() or 1) * span / trajectories if busy and trajectories else None
    return {
        "mode": mode,
        "fresh_envs_per_group": fresh_envs,
        "train_steps": len(records),
        "steady_state_steps": steady_steps,
        "trained_trajectories": sum(r["ppo_actor/trajectories"] for r in records),
        "wall_s": round(wall, 1),
        "seconds_per_step": round((records[-1]["time"] - records[0]["time"]) / steady_steps, 1) if steady_steps else None,
        "trajectories_per_hour": steady,
        "trainer_idle_fraction": last.get("trainer/idle_fraction"),
        "cpu_busy_fraction": busy,
        "cpu_seconds_per_trajectory": cpu_per_trajectory,
        "mean_staleness": (sum(r["rollout/staleness/mean"] for r in records) / len(records)) if records else None,
        "max_staleness": max((r["rollout/staleness/max"] for r in records), default=None),
        "dropped_stale": last.get("rollout/dropped_stale", 0),
        "dropped_uniform_groups": last.get("rollout/dropped_uniform_groups", 0),
        "exactly_once": audit(workdir, RingBuffer.open(os.path.join(workdir, "buffer"))),
    }


def audit(workdir: str, buffer) -> dict:
    """Trained episode ids (WORKDIR/trained_episodes.jsonl) against the buffer's commit log: none trained twice,
    every one committed."""
    trained = []
    path = os.path.join(workdir, "trained_episodes.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            trained = [i for line in f if line.strip() for i in json.loads(line)["episode_ids"]]
    episodes, _ = buffer.read(None)
    committed = {e.episode_id for e in episodes}
    return {"trained": len(trained), "trained_twice": len(trained) - len(set(trained)),
            "not_in_commit_log": len(set(trained) - committed), "committed": len(committed),
            "ok": len(trained) == len(set(trained)) and set(trained) <= committed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regime", choices=("local", "web"), default="local", help="env latency model (see above)")
    parser.add_argument("--variant", default="tiny", help="config variant of configs/constT10.py (tiny, toy)")
    parser.add_argument("--num_workers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6,
                        help=f"steady-state train steps per mode: the window's count (>= {MIN_STEPS} for a ratio)")
    parser.add_argument("--max_minutes", type=float, default=20.0,
                        help="wall-clock cap per mode: a safety net, not the window (a capped arm gets `needs`)")
    parser.add_argument("--arms", default="sync,async", help=f"comma-separated, in order, of {sorted(ARMS)}")
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides for every arm (after --)")
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if args.steps < 1:
        raise SystemExit(f"async_vs_sync: --steps={args.steps}: use --steps >= 1 (>= {MIN_STEPS} for a ratio)")
    if not set(arms) <= set(ARMS) or "async" not in arms or len(arms) < 2 or len(set(arms)) != len(arms):
        raise SystemExit(f"async_vs_sync: --arms={args.arms!r}: give async and at least one of sync, sync_rebuilt")
    with tempfile.TemporaryDirectory(prefix="async_vs_sync_") as root:
        results = {arm: measure(arm, args, root) for arm in arms}
    print(json.dumps(summary(results, args)))


def summary(results: dict, args) -> dict:
    """The JSON report: every arm, async's steady-state ratio over each synchronous arm (null below MIN_STEPS
    steady-state steps in either), and `needs` (how long to rerun) when an arm made too few."""
    asynchronous = results["async"]
    report = {"benchmark": "async_vs_sync", "regime": args.regime, "variant": args.variant,
              "num_workers": args.num_workers, "steps": args.steps, "overrides": list(args.override), **results}
    for arm in (a for a in results if a != "async"):
        enough = min(results[arm]["steady_state_steps"], asynchronous["steady_state_steps"]) >= MIN_STEPS
        report[f"steady_state_ratio_async_over_{arm}"] = (
            asynchronous["trajectories_per_hour"] / results[arm]["trajectories_per_hour"]
            if enough and results[arm]["trajectories_per_hour"] and asynchronous["trajectories_per_hour"] else None)
    short = [m for m in results.values() if m["steady_state_steps"] < MIN_STEPS]
    report["needs"] = None
    if short and args.steps < MIN_STEPS:   # every arm stopped at its count: the count was too small
        report["needs"] = (f"--steps={args.steps} gives at most {args.steps} steady-state steps a mode: a ratio "
                           f"needs --steps >= {MIN_STEPS}")
    elif short:   # an arm stopped at the clock
        slowest = max(short, key=lambda m: m["seconds_per_step"] or float("inf"))
        arm = next(a for a, m in results.items() if m is slowest)
        per_step = slowest["seconds_per_step"] or slowest["wall_s"]
        report["needs"] = (f"{arm} made {slowest['steady_state_steps']} steady-state steps in {args.max_minutes:g} "
                           f"min: rerun with --max_minutes={(MIN_STEPS + 1) * per_step / 60 + 2:.0f}")
    return report


if __name__ == "__main__":
    main()
