"""Summarise a training run's metrics.jsonl into the numbers of the loop on an accelerator (bench/device_loop.sh).

    python bench/loop_summary.py WORKDIR          # prints one JSON object

`summarize(workdir)` -> dict: `updates` (steps logged), `first_update_s` (start of the run to step 1: compiles
included, null without a start time), `seconds_per_update` (median and spread of the step-to-step intervals after
the first, which hold no compile), `generation_tokens_per_s` and `trainer_idle_fraction` (median over those same
steps; the trainer's own metrics: tokens the policy server generated a second, the share of the trainer's time
spent waiting for episodes). A run that logged fewer than 2 steps has no steady-state numbers: they are null and
`needs` says so.
"""

from __future__ import annotations

import json
import os
import statistics
import sys


def read_steps(workdir: str) -> list[dict]:
    """The metrics.jsonl records of `workdir`, in step order (ValueError naming the file when it has none)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{path} not found: the run logged no step (see its log)")
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return sorted(records, key=lambda r: r["step"])


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(workdir: str, started_at: float | None = None) -> dict:
    """See the module docstring. `started_at`: the run's start (time.time()), for `first_update_s`."""
    steps = read_steps(workdir)
    times = [r["time"] for r in steps]
    steady = steps[1:]
    out = {
        "updates": len(steps),
        "first_update_s": (times[0] - started_at) if (started_at is not None and steps) else None,
        "seconds_per_update": _spread([b - a for a, b in zip(times, times[1:])]),
        "generation_tokens_per_s": _spread([r["throughput/tokens_per_s"] for r in steady
                                            if "throughput/tokens_per_s" in r]),
        "trainer_idle_fraction": _spread([r["trainer/idle_fraction"] for r in steady
                                          if "trainer/idle_fraction" in r]),
        "success_rate": [r.get("rollout/success_rate") for r in steps],
    }
    if len(steps) < 2:
        out["needs"] = "at least 2 logged steps for steady-state numbers: raise --config.train.max_steps"
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python bench/loop_summary.py WORKDIR [STARTED_AT]")
    print(json.dumps(summarize(sys.argv[1], float(sys.argv[2]) if len(sys.argv) == 3 else None)))
