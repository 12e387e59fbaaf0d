"""Environment throughput: scripted-oracle MiniWoB++ steps/s with 1, 2, 4 and 8 worker processes, and the
rollout worker's own overhead (everything but browser and policy time) as a fraction of step time.

    python bench/env.py                       # prints one JSON object
    python bench/env.py --workers 1,2 --seconds 5

A last setting repeats 1 worker with BrowserConfig.unthrottled_frames (no 60 fps cap) for comparison.
Each worker is a separate process with its own sandboxed Chromium playing oracle episodes round-robin over
the oracle tasks. All workers of one setting start measuring together (a stdin barrier after warm-up) and
run for --seconds. Time inside WebDriver/CDP calls made by env.reset/step is "browser"; the oracle (its DOM
reads + formatting the action text) stands in for the policy and is "policy"; the rest of the loop
(parsing, bookkeeping, numpy/PIL decode, Python) is the loop's own overhead. Workers report JSON on stdout
(no pickle between processes).

"rollout_worker" runs the real `jaxwebrl.rollout.worker.RolloutWorker` (prompt, screenshot store, ring buffer,
in-process scripted policy whose text comes from the oracle) for --seconds and splits its step time (policy
excluded) into env calls, buffer writes and the worker's own time, from its WorkerStats.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(seconds: float, worker_id: int, unthrottled_frames: bool) -> None:
    from jaxwebrl.env.browser.browser import Browser
    from jaxwebrl.env.browser.chromium import BrowserConfig
    from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT, MiniWobEnv
    from jaxwebrl.env.tasks.miniwob.oracles import oracle_tasks, oracle_text

    browser = Browser(BrowserConfig(viewport=VIEWPORT, unthrottled_frames=unthrottled_frames))
    tasks = oracle_tasks()
    envs = {task: MiniWobEnv(task, browser=browser) for task in tasks}
    for env in envs.values():  # warm-up: load every page once, outside the measured window
        env.reset(0)
    print("ready", flush=True)
    sys.stdin.readline()

    steps = episodes = successes = 0
    policy_s = env_s = policy_browser_s = 0.0
    busy_start = browser.busy_s
    seed = 1000 * worker_id
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        env = envs[tasks[(seed + worker_id) % len(tasks)]]
        t0 = time.perf_counter()
        env.reset(seed)
        env_s += time.perf_counter() - t0
        seed += 1
        while True:
            busy0, t0 = browser.busy_s, time.perf_counter()
            text = oracle_text(env)
            t1 = time.perf_counter()
            policy_s += t1 - t0
            policy_browser_s += browser.busy_s - busy0  # the oracle's DOM reads are policy, not env, time
            result = env.step(text)
            env_s += time.perf_counter() - t1
            steps += 1
            if result.done:
                episodes += 1
                successes += int(result.info.get("success", False))
                break
    wall = time.perf_counter() - t_start
    env_browser_s = browser.busy_s - busy_start - policy_browser_s
    browser.close()
    print(json.dumps({"worker": worker_id, "wall_s": wall, "steps": steps, "episodes": episodes,
                      "successes": successes, "policy_s": policy_s, "env_s": env_s,
                      "browser_s": env_browser_s}), flush=True)


def run_setting(num_workers: int, seconds: float, unthrottled_frames: bool = False) -> dict:
    extra = ["--unthrottled-frames"] if unthrottled_frames else []
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", str(i), "--seconds", str(seconds),
                               *extra],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for i in range(num_workers)]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"bench worker failed to start: {line!r} {proc.stdout.read()[-2000:]}")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = [json.loads(proc.stdout.readline()) for proc in procs]
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    steps = sum(r["steps"] for r in reports)
    wall = max(r["wall_s"] for r in reports)
    env_s = sum(r["env_s"] for r in reports)
    browser_s = sum(r["browser_s"] for r in reports)
    loop_s = sum(r["wall_s"] - r["policy_s"] for r in reports)  # env steps + resets + the loop itself
    overhead_s = loop_s - browser_s
    return {"workers": num_workers, "unthrottled_frames": unthrottled_frames, "steps_per_s": round(steps / wall, 2),
            "episodes_per_s": round(sum(r["episodes"] for r in reports) / wall, 2),
            "success_rate": round(sum(r["successes"] for r in reports) / max(1, sum(r["episodes"] for r in reports)), 3),
            "env_step_ms": round(1e3 * env_s / max(steps, 1), 2),
            "policy_ms_per_step": round(1e3 * sum(r["policy_s"] for r in reports) / max(steps, 1), 2),
            "worker_overhead_fraction": round(overhead_s / max(loop_s, 1e-9), 4)}


def worker_overhead(seconds: float) -> dict:
    """The real rollout worker (jaxwebrl.rollout.worker) on MiniWoB++ with the oracle as its policy: its own
    time (prompting, parsing, episode assembly) and buffer writes as fractions of step time without policy."""
    import tempfile

    from jaxwebrl.buffer.ring import RingBuffer
    from jaxwebrl.env.registry import make_env
    from jaxwebrl.env.browser.browser import Browser
    from jaxwebrl.env.browser.chromium import BrowserConfig
    from jaxwebrl.env.tasks.miniwob.miniwob import TASK_AREA, VIEWPORT
    from jaxwebrl.env.tasks.miniwob.oracles import oracle_tasks, oracle_text
    from jaxwebrl.rollout.client import InProcessClient
    from jaxwebrl.rollout.scripted import ScriptedBackend
    from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig

    current = {}

    def env_factory(spec):  # runs on the worker's env thread, so the shared browser is born there too
        if "browser" not in current:
            current["browser"] = Browser(BrowserConfig(viewport=VIEWPORT))
        current["env"] = make_env(spec, browser=current["browser"])
        return current["env"]

    def oracle_responder(request, rng):  # the policy: reads the page the worker's env shows
        return oracle_text(current["env"]), 0.0

    tasks = tuple(f"miniwob/{t}" for t in oracle_tasks())
    with tempfile.TemporaryDirectory() as tmp:
        buffer = RingBuffer.create(f"{tmp}/buf", capacity_steps=4096, max_seq_len=4096,
                                   screenshot_shape=(TASK_AREA[3], TASK_AREA[2], 3), max_images_per_step=3)
        backend = ScriptedBackend(oracle_responder, fetch_image=buffer.screenshots.get)
        config = WorkerConfig(tasks=tasks, group_size=1, max_new_tokens=128, prompt={"window": 2},
                              max_open_envs=1, step_timeout_s=60)
        worker = RolloutWorker(config, InProcessClient(backend), buffer, env_factory=env_factory)
        try:
            worker.run(max_groups=2)  # warm-up: browser start, first page loads, tokenizer
            warm = worker.stats.to_dict()
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                worker.run(max_groups=1)
            stats = worker.stats.to_dict()
        finally:
            worker.close()
            if "browser" in current:
                current["browser"].close()
    delta = {k: stats[k] - warm[k] for k in ("steps", "episodes", "successes", "total_s", "env_s", "generate_s",
                                             "buffer_s")}
    step_s = delta["total_s"] - delta["generate_s"]  # everything but the policy
    own_s = step_s - delta["env_s"] - delta["buffer_s"]
    return {"steps": delta["steps"], "episodes": delta["episodes"],
            "success_rate": round(delta["successes"] / max(delta["episodes"], 1), 3),
            "step_ms_without_policy": round(1e3 * step_s / max(delta["steps"], 1), 2),
            "env_fraction": round(delta["env_s"] / step_s, 4),
            "buffer_fraction": round(delta["buffer_s"] / step_s, 4),
            "worker_own_fraction": round(own_s / step_s, 4),
            "worker_overhead_fraction": round((own_s + delta["buffer_s"]) / step_s, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--unthrottled-frames", action="store_true",
                        help="in --child: BrowserConfig.unthrottled_frames (the main run adds a 1-worker setting with it)")
    parser.add_argument("--no-worker", action="store_true", help="skip the rollout-worker overhead measurement")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.seconds, args.child, args.unthrottled_frames)
        return
    settings = [run_setting(int(n), args.seconds) for n in args.workers.split(",")]
    settings.append(run_setting(1, args.seconds, unthrottled_frames=True))
    worker = worker_overhead(args.seconds) if not args.no_worker else None
    base = settings[0]["steps_per_s"]
    for s in settings:
        s["speedup_vs_first"] = round(s["steps_per_s"] / base, 2) if base else None
    print(json.dumps({"bench": "env", "cpu_count": os.cpu_count(), "seconds_per_setting": args.seconds,
                      "settings": settings, "rollout_worker": worker}))


if __name__ == "__main__":
    main()
