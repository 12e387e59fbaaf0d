"""Doctor: `python -m jaxwebrl.env.check` starts Chromium, lets the scripted oracles play MiniWoB++ tasks, and
prints one JSON object (versions, sandbox state, success rate per task, timings per reset/screenshot/action).
Exits 1 when the browser cannot start or the overall success rate is below --threshold.

    python -m jaxwebrl.env.check                          # every task with an oracle, 3 episodes each
    python -m jaxwebrl.env.check --tasks click-test,login-user --episodes 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def _stats_ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"count": 0}
    ms = np.asarray(seconds) * 1e3
    return {"count": int(ms.size), "mean": round(float(ms.mean()), 2), "p50": round(float(np.percentile(ms, 50)), 2),
            "p90": round(float(np.percentile(ms, 90)), 2), "max": round(float(ms.max()), 2)}


def run_check(tasks: list[str], episodes: int, screenshot_size: tuple[int, int] | None) -> dict:
    """Play `episodes` oracle episodes of each task in one browser; returns the report dict."""
    from jaxwebrl.env.base import EnvFailure
    from jaxwebrl.env.browser import Browser, BrowserConfig
    from jaxwebrl.env.miniwob import VIEWPORT, MiniWobEnv
    from jaxwebrl.env.oracles import run_episode

    report: dict = {"ok": False, "tasks": {}, "errors": []}
    t0 = time.perf_counter()
    try:
        browser = Browser(BrowserConfig(viewport=VIEWPORT))
    except (FileNotFoundError, EnvFailure, RuntimeError) as exc:
        report["errors"].append(f"browser did not start: {exc}")
        return report
    report["startup_s"] = round(time.perf_counter() - t0, 3)
    caps = browser.driver.capabilities
    report.update(chromium=caps.get("browserVersion"),
                  chromedriver=str(caps.get("chrome", {}).get("chromedriverVersion", "")).split(" ")[0],
                  browser_user=browser.config.run_as_user if os.geteuid() == 0 else "(this user)",
                  sandboxed=browser.sandboxed, sandbox_note=browser.sandbox_note,
                  request_guard=browser.request_guard is not None and browser.request_guard.alive)
    timings: dict[str, list[float]] = {"reset": [], "screenshot": [], "action": []}
    solved = total = 0
    try:
        for task in tasks:
            env = MiniWobEnv(task, browser=browser, screenshot_size=screenshot_size)
            results = []
            for seed in range(episodes):
                try:
                    results.append(run_episode(env, seed))
                except Exception as exc:  # noqa: BLE001 - the doctor reports every failure and goes on
                    report["errors"].append(f"{task} seed {seed}: {type(exc).__name__}: {exc}")
                    results.append({"success": False, "steps": 0})
                    if not browser.alive:
                        browser.restart()
            for key in timings:
                timings[key].extend(env.timings[key])
            wins = sum(r["success"] for r in results)
            solved, total = solved + wins, total + len(results)
            report["tasks"][task] = {"success_rate": round(wins / len(results), 3), "episodes": len(results),
                                     "mean_steps": round(float(np.mean([r["steps"] for r in results])), 2)}
    finally:
        browser.close()
    report["success_rate"] = round(solved / max(total, 1), 3)
    report["timings_ms"] = {key: _stats_ms(values) for key, values in timings.items()}
    report["total_s"] = round(time.perf_counter() - t0, 2)
    return report


def main(argv: list[str] | None = None) -> int:
    from jaxwebrl.env.miniwob import available_tasks
    from jaxwebrl.env.oracles import oracle_tasks

    parser = argparse.ArgumentParser(prog="python -m jaxwebrl.env.check", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="", help="comma-separated MiniWoB++ tasks (default: all with oracles)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes (seeds 0..N-1) per task")
    parser.add_argument("--threshold", type=float, default=0.9, help="minimum overall success rate")
    parser.add_argument("--screenshot-size", default="", help="resize screenshots to WxH, e.g. 320x420")
    args = parser.parse_args(argv)

    tasks = [t for t in args.tasks.split(",") if t] or oracle_tasks()
    unknown = [t for t in tasks if t not in oracle_tasks()]
    if unknown:
        known = "not a MiniWoB++ task" if any(t not in available_tasks() for t in unknown) else "no oracle"
        parser.error(f"{unknown}: {known}; tasks with oracles: {','.join(oracle_tasks())}")
    if args.episodes < 1:
        parser.error("--episodes must be >= 1")
    size = None
    if args.screenshot_size:
        try:
            width, height = (int(v) for v in args.screenshot_size.lower().split("x"))
            size = (width, height)
        except ValueError:
            parser.error(f"--screenshot-size must look like 320x420, got {args.screenshot_size!r}")

    report = run_check(tasks, args.episodes, size)
    report["threshold"] = args.threshold
    report["ok"] = not report["errors"] and report.get("success_rate", 0.0) >= args.threshold
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
