r"""Where a rollout worker's browser step goes: the generation path between workers and the policy server, measured.

Builds a run's policy server (in this process, as the trainer does) and its rollout workers (real processes, real
browsers or the toy env), lets them play a warm-up and then a measured window, both counted in browser steps (the
window opens once the workers have played `--warmup_steps`: start-up and the first compiles behind it; it closes
once they have played `--window_steps` more, however long that takes on a loaded machine; `--max_wait_s` bounds
the whole, an error naming the count reached), and reports per browser step, from the workers' own clocks and the
server's report of the same request (WorkerStats.recent_steps):

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

    python bench/rollout.py --workers=2,8 --variant=tiny --window_steps=1000
    python bench/rollout.py --workers=2 --loop=train --window_steps=2000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


POLL_S = 0.2   # how often the workers' stats files are read while a window fills


class Window:
    """The workers' step counts (their stats files, rewritten after every group) at the window's opening and
    closing: opens once they have played `warmup_steps` in all, closes once they have played `window_steps` more.
    TimeoutError naming the count reached when `max_wait_s` passes first; RuntimeError when `stopped()` first."""

    def __init__(self, stats_dir: str, warmup_steps: int, window_steps: int, max_wait_s: float,
                 check=lambda: None, stopped=lambda: False):
        if warmup_steps < 1 or window_steps < 1:
            raise ValueError(f"--warmup_steps={warmup_steps} and --window_steps={window_steps} must be >= 1: the "
                             "window opens after the first steps (compiles) and must hold steps to measure")
        self.stats_dir, self.warmup_steps, self.window_steps = stats_dir, warmup_steps, window_steps
        self.deadline = time.monotonic() + max_wait_s
        self.max_wait_s, self.check, self.stopped = max_wait_s, check, stopped

    def _played(self, steps: int, what: str) -> list[dict]:
        from jaxwebrl.rollout.pool import read_stats

        while True:
            self.check()
            stats = read_stats(self.stats_dir)
            played = sum(s["steps"] for s in stats)
            if played >= steps:
                return stats
            if self.stopped():
                raise RuntimeError(f"the run stopped during the {what}: {played} of {steps} steps played")
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"the {what} did not fill within --max_wait_s={self.max_wait_s:g}: {played} of "
                                   f"{steps} steps played; raise --max_wait_s or lower the step counts")
            time.sleep(POLL_S)

    def open(self) -> dict[tuple, int]:
        """Blocks until the warm-up is played; each worker's steps then (`_steps_by_worker`)."""
        self.before = self._played(self.warmup_steps, "warm-up")
        self.opened = time.monotonic()
        return _steps_by_worker(self.before)

    def close(self) -> tuple[list[dict], float]:
        """Blocks until `window_steps` more are played; (the workers' stats then, the window's seconds)."""
        after = self._played(sum(s["steps"] for s in self.before) + self.window_steps, "window")
        return after, time.monotonic() - self.opened


def measure(variant: str, num_workers: int, warmup_steps: int, window_steps: int, max_wait_s: float,
            overrides: list[str]) -> dict:
    from configs.constT10 import get_config
    from jaxwebrl.buffer import from_config as run_buffer
    from jaxwebrl.checkpoint.policies import recipe_policy
    from jaxwebrl.rollout.pool import WorkerPool
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
                window = Window(stats_dir, warmup_steps, window_steps, max_wait_s, check=pool.raise_if_failed)
                before = window.open()
                server_before = service.server.stats()
                after, seconds = window.close()
                server_after = service.server.stats()
    table = step_table(_new_steps(after, before))
    served = {k: server_after[k] - server_before[k] for k in ("requests", "batches", "busy_s")}
    return {"variant": variant, "num_workers": num_workers, "warmup_steps": warmup_steps,
            "window_steps": window_steps, "window_s": round(seconds, 1),
            "overrides": overrides, **breakdown(table), "server": served,
            "server_busy_fraction": round(served["busy_s"] / seconds, 3) if seconds else None}


def measure_in_training(variant: str, num_workers: int, warmup_steps: int, window_steps: int, max_wait_s: float,
                        overrides: list[str]) -> dict:
    """The per-step breakdown of the workers of a real training run (the `window_steps` after its first
    `warmup_steps`); the run is stopped when the window closes."""
    import threading

    from configs.constT10 import get_config
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
            try:
                window = Window(stats_dir, warmup_steps, window_steps, max_wait_s, stopped=stop.is_set)
                marks["before"] = window.open()
                marks["after"], marks["seconds"] = window.close()
            except (TimeoutError, RuntimeError) as err:
                marks["error"] = str(err)
            finally:
                stop.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        supervisor.run(config, root, stop=stop)
        watcher.join()
        records = read_metrics(root)
    if "error" in marks:
        raise RuntimeError(marks["error"])
    table = step_table(_new_steps(marks["after"], marks["before"]))
    return {"variant": variant, "num_workers": num_workers, "loop": "train", "overrides": overrides,
            "warmup_steps": warmup_steps, "window_steps": window_steps,
            "window_s": round(marks["seconds"], 1), "train_steps": len(records),
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
    parser.add_argument("--warmup_steps", type=int, default=50,
                        help="browser steps (all workers) before the window opens: start-up and first compiles")
    parser.add_argument("--window_steps", type=int, default=1000,
                        help="browser steps measured per worker count (each worker keeps its last 512)")
    parser.add_argument("--max_wait_s", type=float, default=1800.0,
                        help="a warm-up and window not played within this is an error naming the count reached")
    parser.add_argument("--loop", choices=("rollout", "train"), default="rollout",
                        help="rollout: server and workers only; train: inside a real training run")
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides (after --)")
    args = parser.parse_args()
    run = measure if args.loop == "rollout" else measure_in_training
    results = [run(args.variant, int(n), args.warmup_steps, args.window_steps, args.max_wait_s, args.override)
               for n in args.workers.split(",") if n]
    print(json.dumps({"benchmark": "rollout", "results": results}))


if __name__ == "__main__":
    main()
