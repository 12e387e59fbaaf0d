"""A run's curves for plotting: WORKDIR/metrics.jsonl (trainer) and WORKDIR/eval/<name>/eval.json (launch/eval.py).

    run = load_run(workdir)
    run.series("rollout/reward")        # (steps [N] int64, values [N] float64; missing/None -> NaN)
    run.evals                           # [(name, step or 0 for the initial policy, report)], by step
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import numpy as np

# What the training-curves notebook plots: (title, [(metrics key, legend label)]).
PANELS = (
    ("reward", [("rollout/reward", "trained batch reward"), ("rollout/success_rate", "trained batch success"),
                ("rollout/success_rate_seen", "success of all episodes read"),
                ("eval/greedy_success", "greedy check (train.stop_at_greedy_success)")]),
    ("steps of successes vs failures", [("rollout/steps_success/avg", "successes"),
                                        ("rollout/steps_failure/avg", "failures")]),
    ("behaviour cap and clipping", [("ppo_actor/behave_cap_ratio", "behave_cap_ratio"),
                                    ("ppo_actor/update/clip_ratio/avg", "clip ratio"),
                                    ("ppo_actor/update/dual_clip_ratio/avg", "dual-clip ratio")]),
    ("staleness (policy versions)", [("rollout/staleness/mean", "mean"), ("rollout/staleness/max", "max")]),
    ("memory size (chars)", [("rollout/memory_chars/avg", "memory chars")]),
)


@dataclasses.dataclass
class Run:
    workdir: str
    records: list[dict]
    evals: list[tuple[str, int, dict]]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        steps = np.array([int(r["step"]) for r in self.records], np.int64)
        values = np.array([np.nan if r.get(key) is None else float(r[key]) for r in self.records], np.float64)
        return steps, values

    def has(self, key: str) -> bool:
        return any(r.get(key) is not None for r in self.records)

    def split_success(self) -> dict[str, list[tuple[int, float]]]:
        """{split: [(step, success rate)]} over the evals, plus "all" (every episode)."""
        out: dict[str, list[tuple[int, float]]] = {}
        for _, step, report in self.evals:
            for split, stats in list(report["splits"].items()) + [("all", report["overall"])]:
                if stats.get("success_rate") is not None:
                    out.setdefault(split, []).append((step, float(stats["success_rate"])))
        return out


def load_run(workdir: str) -> Run:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: point the notebook at a training workdir "
                                f"(launch/train.py --workdir=...)")
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    evals = []
    for file in sorted(glob.glob(os.path.join(workdir, "eval", "*", "eval.json"))):
        with open(file, encoding="utf-8") as f:
            report = json.load(f)
        step = (report.get("policy") or {}).get("step") or 0
        evals.append((os.path.basename(os.path.dirname(file)), int(step), report))
    evals.sort(key=lambda e: e[1])
    return Run(workdir, records, evals)
