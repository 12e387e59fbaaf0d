r"""Where a rollout worker's browser step goes: the generation path between workers and the policy server, measured.

Builds a run's policy server (in this process, as the trainer does) and its rollout workers (real processes, real
browsers or the toy env), lets them play for a warm-up and then a measured window, and reports per browser step,
from the workers' own clocks and the server's report of the same request (WorkerStats.recent_steps):

  screenshot_put_s  screenshot written to the ring buffer     prompt_s   prompt built (worker)
  generate_s        generate round trip the worker waited     env_step_s the env's step (browser action)
  queue_s           queued at the server before its batch     encode_s   the batch's prompts rendered (template,
  compute_s         the sampler: prefill + decode of the batch            screenshots read by ref, image processor)
  transport_s       generate_s - queue_s - encode_s - compute_s (wire, handler threads, thread hand-offs)

as medians and 90th percentiles, the share of steps whose batch compiled, the mean batch size, and the issue-14
figure of merit: median generate_s / compute_s (≤ 2: the worker waits at most twice what the sampler spends).
`--loop=rollout` (default) runs no trainer: the generation path alone. `--loop=train` measures the same steps
inside a real training run (launch/train.py's supervisor: trainer, policy server and workers sharing the machine),
which is where contention shows.

    python bench/rollout.py --workers=2,8 --variant=tiny --window_s=60
    python bench/rollout.py --workers=2 --loop=train --window_s=120
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


def measure(variant: str, num_workers: int, warmup_s: float, window_s: float, overrides: list[str]) -> dict:
    from configs.constT10 import get_config
    from jaxwebrl.buffer import from_config as run_buffer
    from jaxwebrl.checkpoint.policies import recipe_policy
    from jaxwebrl.rollout.pool import WorkerPool, read_stats
    from jaxwebrl.rollout.serving import PolicyService
    from jaxwebrl.rollout.spec import worker_spec

    config = get_config(variant)
    config.rollout.num_workers = num_workers
    apply_overrides(config, overrides)
    policy = recipe_policy(config)
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as root:
        buffer = run_buffer.open_or_create(config, root, policy.config.text.vocab_size)
        with PolicyService.for_policy(policy, buffer, config, host="127.0.0.1", num_clients=num_workers) as service:
            service.start()
            stats_dir = os.path.join(root, "stats")
            spec = worker_spec(config, buffer_path=run_buffer.path_for(config, root), address=service.address, token=service.token,
                               stats_dir=stats_dir)
            with WorkerPool(spec, num_workers) as pool:
                time.sleep(warmup_s)
                before = _steps_by_worker(read_stats(stats_dir))
                server_before = service.server.stats()
                start = time.monotonic()
                time.sleep(window_s)
                pool.raise_if_failed()
                after = read_stats(stats_dir)
                window = time.monotonic() - start
                server_after = service.server.stats()
    table = step_table(_new_steps(after, before))
    served = {k: server_after[k] - server_before[k] for k in ("requests", "batches", "busy_s")}
    return {"variant": variant, "num_workers": num_workers, "window_s": round(window, 1),
            "overrides": overrides, **breakdown(table), "server": served,
            "server_busy_fraction": round(served["busy_s"] / window, 3) if window else None}


def measure_in_training(variant: str, num_workers: int, warmup_s: float, window_s: float,
                        overrides: list[str]) -> dict:
    """The per-step breakdown of the workers of a real training run (steps of its last `window_s` seconds)."""
    import threading

    from configs.constT10 import get_config
    from jaxwebrl.rollout.pool import read_stats
    from jaxwebrl.train import supervisor
    from jaxwebrl.train.metrics import read_metrics

    config = get_config(variant)
    config.rollout.num_workers = num_workers
    config.train.max_steps = 10**6
    config.metrics.progress_bar = config.metrics.tensorboard = False
    config.checkpoint.save_every_steps = 10**6
    apply_overrides(config, overrides)
    with tempfile.TemporaryDirectory(prefix="bench_rollout_train_") as root:
        stats_dir = os.path.join(root, "rollout_stats")
        stop = threading.Event()
        marks = {}

        def watch():
            if not stop.wait(warmup_s):
                marks["before"] = _steps_by_worker(read_stats(stats_dir))
                marks["start"] = time.monotonic()
            if not stop.wait(window_s):
                marks["after"] = read_stats(stats_dir)
                marks["end"] = time.monotonic()
                stop.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        supervisor.run(config, root, stop=stop)
        watcher.join()
        records = read_metrics(root)
    table = step_table(_new_steps(marks.get("after", []), marks.get("before", {})))
    return {"variant": variant, "num_workers": num_workers, "loop": "train", "overrides": overrides,
            "window_s": round(marks.get("end", 0) - marks.get("start", 0), 1), "train_steps": len(records),
            "trainer_idle_fraction": records[-1].get("trainer/idle_fraction") if records else None,
            **breakdown(table)}


def apply_overrides(config, overrides: list[str]) -> None:
    """`--config.a.b=value` items onto `config`, each value parsed as the field's current type."""
    for item in overrides:
        key, _, value = item.removeprefix("--config.").partition("=")
        parent, _, leaf = key.rpartition(".")
        node = config
        for part in filter(None, parent.split(".")):
            node = node[part]
        old = node[leaf]
        node[leaf] = (value.lower() in ("1", "true") if isinstance(old, bool) else
                      type(old)(value) if old is not None else value)


def step_table(rows: list[list]) -> dict[str, np.ndarray]:
    """WorkerStats.recent_steps rows as one float64 column per STEP_TIMING_FIELDS name (None -> NaN)."""
    from jaxwebrl.rollout.worker import STEP_TIMING_FIELDS

    return {name: np.array([np.nan if r[i] is None else r[i] for r in rows], float)
            for i, name in enumerate(STEP_TIMING_FIELDS)}


def breakdown(table: dict[str, np.ndarray]) -> dict:
    """Medians / p90 of every per-step time, the transport remainder, and the figure of merit."""
    steps = len(table["generate_s"])
    if steps == 0:
        return {"steps": 0}
    table = dict(table, transport_s=table["generate_s"] - table["queue_s"] - table["encode_s"] - table["compute_s"])
    out = {"steps": steps, "median_s": {}, "p90_s": {}}
    for name, values in table.items():
        if name.endswith("_s"):
            out["median_s"][name] = _round(np.nanmedian(values))
            out["p90_s"][name] = _round(np.nanpercentile(values, 90))
    out["compiled_fraction"] = _round(np.nanmean(table["compiled"]))
    out["mean_batch_size"] = _round(np.nanmean(table["batch_size"]))
    out["median_generate_over_compute"] = _round(np.nanmedian(table["generate_s"] / table["compute_s"]))
    return out


def _round(x) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


def _steps_by_worker(stats: list[dict]) -> dict[tuple, int]:
    return {(s["worker_id"], s["incarnation"]): s["steps"] for s in stats}


def _new_steps(after: list[dict], before: dict[tuple, int]) -> list[list]:
    """Per-step rows recorded after `before` (at most the RECENT_STEPS each worker keeps)."""
    rows = []
    for s in after:
        new = s["steps"] - before.get((s["worker_id"], s["incarnation"]), 0)
        rows.extend(s["recent_steps"][-new:] if new > 0 else [])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="tiny", help="config variant of configs/constT10.py (tiny, toy)")
    parser.add_argument("--workers", default="2,8", help="comma-separated worker counts, measured one after another")
    parser.add_argument("--warmup_s", type=float, default=45.0, help="seconds before the window (browsers, compiles)")
    parser.add_argument("--window_s", type=float, default=60.0, help="measured seconds per worker count")
    parser.add_argument("--loop", choices=("rollout", "train"), default="rollout",
                        help="rollout: server and workers only; train: inside a real training run")
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides (after --)")
    args = parser.parse_args()
    run = measure if args.loop == "rollout" else measure_in_training
    results = [run(args.variant, int(n), args.warmup_s, args.window_s, args.override)
               for n in args.workers.split(",") if n]
    print(json.dumps({"benchmark": "rollout", "results": results}))


if __name__ == "__main__":
    main()
