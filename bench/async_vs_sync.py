"""Asynchronous vs synchronous training throughput, side by side in one run; prints one JSON object.

Same recipe, same variant, same number of rollout workers, same wall-clock budget: first the synchronous
baseline (`rollout.mode=sync`: rollout, then train, alternating), then the paper's asynchronous mode. Reported per
mode: trained trajectories per hour, train steps, trainer idle fraction, episodes dropped as stale; and the
async/sync trajectories-per-hour ratio.

    python bench/async_vs_sync.py --budget_s=120 --variant=tiny --num_workers=2
"""

import argparse
import json
import os
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(mode: str, args, root: str, max_steps: int = 10**6) -> dict:
    from configs.constT10 import get_config
    from jaxwebrl.train import supervisor
    from jaxwebrl.train.config_validation import validate
    from jaxwebrl.train.metrics import read_metrics

    config = get_config(args.variant)
    config.rollout.mode = "async" if mode == "warmup" else mode
    config.rollout.num_workers = args.num_workers
    if args.small:
        config.env.group_size, config.train.consumer_batch_size, config.train.ppo_n_epochs = 2, 4, 1
    config.train.max_steps = max_steps             # the budget ends the run
    config.metrics.progress_bar = False
    config.metrics.tensorboard = False
    config.checkpoint.save_every_steps = 10**6     # no checkpoint I/O inside the measured window
    workdir = os.path.join(root, mode)
    validate(config, workdir)
    stop = threading.Event()
    timer = threading.Timer(args.budget_s, stop.set)
    start = time.monotonic()
    timer.start()
    try:
        supervisor.run(config, workdir, stop=stop)
    finally:
        timer.cancel()
    wall = time.monotonic() - start
    records = read_metrics(workdir) if os.path.exists(os.path.join(workdir, "metrics.jsonl")) else []
    last = records[-1] if records else {}
    trained = sum(r["ppo_actor/trajectories"] for r in records)
    # steady state: trajectories trained after the first step over the time since it (startup and compiles excluded)
    steady = None
    if len(records) >= 2:
        span = records[-1]["time"] - records[0]["time"]
        steady = sum(r["ppo_actor/trajectories"] for r in records[1:]) / span * 3600.0 if span > 0 else None
    return {
        "mode": mode,
        "train_steps": len(records),
        "trained_trajectories": trained,
        "wall_s": round(wall, 1),
        "trajectories_per_hour": steady,
        "trajectories_per_hour_incl_startup": last.get("throughput/trajectories_per_hour", 0.0),
        "trainer_idle_fraction": last.get("trainer/idle_fraction"),
        "dropped_stale": last.get("rollout/dropped_stale", 0),
        "mean_staleness": (sum(r["rollout/staleness/mean"] for r in records) / len(records)) if records else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget_s", type=float, default=120.0, help="wall-clock seconds per mode")
    parser.add_argument("--variant", default="tiny", help="config variant of configs/constT10.py (tiny, toy)")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--small", action="store_true",
                        help="G=2, 4 trajectories per step, 1 epoch (more steps inside a short budget)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="async_vs_sync_") as root:
        measure("warmup", args, root, max_steps=1)   # compiles the update step once (cached) for both modes
        sync = measure("sync", args, root)
        asynchronous = measure("async", args, root)
    budget_ratio = (asynchronous["trajectories_per_hour_incl_startup"] / sync["trajectories_per_hour_incl_startup"]
                    if sync["trajectories_per_hour_incl_startup"] else None)
    steady_ratio = (asynchronous["trajectories_per_hour"] / sync["trajectories_per_hour"]
                    if sync["trajectories_per_hour"] and asynchronous["trajectories_per_hour"] else None)
    print(json.dumps({"benchmark": "async_vs_sync", "variant": args.variant, "num_workers": args.num_workers,
                      "budget_s": args.budget_s, "sync": sync, "async": asynchronous,
                      "trajectories_per_hour_ratio_async_over_sync": budget_ratio,
                      "steady_state_ratio_async_over_sync": steady_ratio}))


if __name__ == "__main__":
    main()
