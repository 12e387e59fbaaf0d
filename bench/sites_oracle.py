"""The oracle sweep of the bundled offline sites: every task of `jaxwebrl/env/tasks/sites/tasks.jsonl` played once
by its plan oracle in real headless Chromium, scored by the ground truth; then again with every click snapped to the
constrained grammar's click grid (`eval.demos.snap_click`: what a constrained policy can emit; the docs site's
search tasks need typing, which the grammar cannot express, and are left out of that pass); prints one JSON object.

    python bench/sites_oracle.py > docs/results/sites_oracle.json
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxwebrl.env.browser.browser import Browser  # noqa: E402
from jaxwebrl.env.browser.chromium import BrowserConfig  # noqa: E402
from jaxwebrl.env.registry import action_texts, check_env_spec, env_specs, make_env, task_oracle  # noqa: E402
from jaxwebrl.env.tasks.episode import run_episode  # noqa: E402
from jaxwebrl.eval.demos import snap_click  # noqa: E402


def snapped(oracle, texts):
    """The oracle with its clicks snapped to the grammar's nearest click (its answers are in the grammar)."""
    return lambda env, observation, step: snap_click(oracle(env, observation, step), texts, env.task_id)


def sweep(specs, browser, texts=None) -> list:
    """One oracle episode of each spec (clicks snapped to `texts` when given): a row per task."""
    rows = []
    for spec in specs:
        checked = check_env_spec(spec)
        env = make_env(spec, browser=browser, screenshot_size=(320, 240), max_steps=30)
        oracle = task_oracle(spec) if texts is None else snapped(task_oracle(spec), texts)
        try:
            result = run_episode(env, 0, oracle)
        except Exception as exc:  # noqa: BLE001 - a failed task is a row of the sweep, not its end
            result = {"success": False, "steps": 0, "error": f"{type(exc).__name__}: {exc}"}
        rows.append({"task_id": checked.task_id, "difficulty": checked.difficulty, "success": result["success"],
                     "steps": result["steps"], **({"error": result["error"]} if "error" in result else {})})
    return rows


def summary(rows) -> dict:
    by = collections.defaultdict(list)
    for row in rows:
        by[row["difficulty"]].append(row)
    return {"tasks": len(rows), "success_rate": round(sum(r["success"] for r in rows) / len(rows), 4),
            "by_difficulty": {d: {"tasks": len(rs), "success_rate": round(sum(r["success"] for r in rs) / len(rs), 4),
                                  "mean_steps": round(sum(r["steps"] for r in rs) / len(rs), 2)}
                              for d, rs in sorted(by.items())}}


def main() -> dict:
    t0 = time.perf_counter()
    specs = env_specs("sites")
    browser = Browser(BrowserConfig(viewport=check_env_spec(specs[0]).viewport))
    try:
        rows = sweep(specs, browser)
        clicks_only = [s for s in specs if not check_env_spec(s).task_id.startswith("docs-")]
        snapped_rows = sweep(clicks_only, browser, action_texts(clicks_only))
    finally:
        browser.close()
    return {**summary(rows), "snapped_to_click_grid": {**summary(snapped_rows), "episodes": snapped_rows},
            "seconds": round(time.perf_counter() - t0, 1), "episodes": rows}


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
