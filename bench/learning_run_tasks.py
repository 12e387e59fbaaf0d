"""Which MiniWoB++ tasks suit the CPU learning run: per task, how often uniformly random clicks on the tiny
policy's click grid win (the ceiling of an untrained constrained policy), how often the scripted oracle wins
when its clicks are snapped to that grid (can the grid solve the task at all?), and episodes per minute.

    python bench/learning_run_tasks.py                          # every Easy task with an oracle, 10x10 grid
    python bench/learning_run_tasks.py --tasks click-test,click-button --seeds 20 --grid 10

Seeds come from the training range (0..N-1; evaluation holds out 1_000_000+). Prints one JSON object:
{"grid": n, "horizon": h, "tasks": {task: {"random_grid": rate, "oracle_snapped": rate, "oracle": rate,
"episodes_per_min": random-click episodes per minute (one browser)}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grid_points(n: int) -> np.ndarray:
    """[n] int: centres of n equal cells of the 0..1000 action space (n = 10 gives the policy server's grid)."""
    return np.round((np.arange(n) + 0.5) * 1000.0 / n).astype(int)


def snap(value: int, points: np.ndarray) -> int:
    return int(points[np.argmin(np.abs(points - value))])


def play(env, seed: int, choose) -> tuple[bool, int]:
    """One episode where `choose(env, step)` gives each Action; returns (success, steps)."""
    env.reset(seed)
    for step in range(env.max_steps):
        result = env.step(choose(env, step))
        if result.terminated or result.truncated:
            return bool(result.info.get("success")), step + 1
    return False, env.max_steps


def measure(task: str, seeds: range, grid: int, horizon: int, browser, rng) -> dict:
    from jaxwebrl.env.agent.actions import Action
    from jaxwebrl.env.tasks.miniwob.miniwob import MiniWobEnv
    from jaxwebrl.env.tasks.miniwob.oracles import get_oracle

    points = grid_points(grid)
    oracle = get_oracle(task)
    env = MiniWobEnv(task, browser=browser, max_steps=horizon, screenshot_size=(64, 64))

    def random_click(env, step):
        return Action("click", x=int(rng.choice(points)), y=int(rng.choice(points)))

    def snapped(env, step):
        action = oracle(env)
        if action.kind == "click":
            return Action("click", x=snap(action.x, points), y=snap(action.y, points))
        return action

    env.reset(seeds[0])  # load the page outside the timed window
    start = time.perf_counter()
    random_wins = [play(env, s, random_click)[0] for s in seeds]
    minutes = (time.perf_counter() - start) / 60.0
    snapped_wins = [play(env, s, snapped)[0] for s in seeds]
    oracle_wins = [play(env, s, lambda e, _: oracle(e))[0] for s in seeds]
    return {"random_grid": float(np.mean(random_wins)), "oracle_snapped": float(np.mean(snapped_wins)),
            "oracle": float(np.mean(oracle_wins)), "episodes_per_min": round(len(seeds) / minutes, 1)}


def main() -> None:
    from jaxwebrl.env.browser.browser import Browser
    from jaxwebrl.env.browser.chromium import BrowserConfig
    from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT
    from jaxwebrl.env.tasks.miniwob.miniwob_tasks import split_tasks
    from jaxwebrl.env.tasks.miniwob.oracles import oracle_tasks

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default=None, help="comma-separated MiniWoB++ tasks (default: Easy with oracle)")
    parser.add_argument("--seeds", type=int, default=20, help="instances per task (training seeds 0..N-1)")
    parser.add_argument("--grid", type=int, default=10, help="click grid cells per axis")
    parser.add_argument("--horizon", type=int, default=5, help="steps per episode (configs: env.max_episode_steps)")
    args = parser.parse_args()
    tasks = args.tasks.split(",") if args.tasks else [t for t in oracle_tasks() if t in split_tasks("easy")]
    rng = np.random.default_rng(0)
    browser = Browser(BrowserConfig(viewport=VIEWPORT))
    try:
        out = {task: measure(task, range(args.seeds), args.grid, args.horizon, browser, rng) for task in tasks}
    finally:
        browser.close()
    print(json.dumps({"grid": args.grid, "horizon": args.horizon, "seeds": args.seeds, "tasks": out}))


if __name__ == "__main__":
    main()
