"""Episodes/hour of rollout workers launched locally (`WorkerPool`) vs through Ray (`RayWorkerPool`), same machine.

Both launchers run the same worker spec: the toy env, the policy behind the real pyzmq transport (the scripted
test backend, optionally with a per-request delay standing in for generation time), a real ring buffer. Rounds
alternate local / Ray so drifting machine load hits both alike. In each round the pool starts, every worker
finishes a first group (start-up excluded), then the episodes appended during the window are counted from
the buffer: the window lasts `--window_s` and then stays open until it holds `--min_episodes`, so a loaded machine
lengthens it instead of emptying it. Prints one JSON object; `overhead` = 1 − ray_rate / local_rate (target ≤ 0.10).

    python bench/ray_overhead.py --workers=2 --window_s=20 --rounds=2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def count_since(buffer, cursor):
    episodes, cursor = buffer.read(since=cursor)
    return len(episodes), {e.info["worker_id"] for e in episodes}, cursor


def one_round(make_pool, buffer, num_workers: int, window_s: float, min_episodes: int,
              warmup_timeout_s: float) -> dict:
    _, _, cursor = count_since(buffer, None)
    started = time.perf_counter()
    with make_pool() as pool:
        seen: set[int] = set()
        while len(seen) < num_workers:  # start-up: every worker has appended at least one episode
            if time.perf_counter() - started > warmup_timeout_s:
                raise RuntimeError(f"only workers {sorted(seen)} produced an episode in {warmup_timeout_s} s")
            pool.raise_if_failed()
            _, workers, cursor = count_since(buffer, cursor)
            seen |= workers
            time.sleep(0.2)
        startup_s = time.perf_counter() - started
        window_start = time.perf_counter()
        time.sleep(window_s)
        episodes, _, cursor = count_since(buffer, cursor)
        while episodes < min_episodes:   # a loaded machine: the window stays open until it holds its count
            if time.perf_counter() - window_start > window_s + warmup_timeout_s:
                raise RuntimeError(f"the window held {episodes} of its {min_episodes} episodes after "
                                   f"{window_s + warmup_timeout_s:.0f} s: the workers stalled")
            pool.raise_if_failed()
            time.sleep(0.2)
            more, _, cursor = count_since(buffer, cursor)
            episodes += more
        elapsed = time.perf_counter() - window_start
        pool.raise_if_failed()
    return {"episodes": episodes, "window_s": elapsed, "startup_s": startup_s,
            "episodes_per_hour": 3600.0 * episodes / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window_s", type=float, default=20.0, help="a round's window: at least this long")
    parser.add_argument("--min_episodes", type=int, default=1, help="and holding at least this many episodes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--delay_ms", type=float, default=0.0, help="scripted generation delay per request")
    parser.add_argument("--warmup_timeout_s", type=float, default=180.0)
    args = parser.parse_args()

    import ray

    from jaxwebrl.buffer.ring import RingBuffer
    from jaxwebrl.rollout.pool import WorkerPool
    from jaxwebrl.rollout.ray_launcher import RayWorkerPool
    from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
    from jaxwebrl.rollout.transport import TransportServer, new_token

    workdir = tempfile.mkdtemp(prefix="ray_overhead_")
    path = os.path.join(workdir, "buffer")
    buffer = RingBuffer.create(path, capacity_steps=8192, max_seq_len=1024, screenshot_shape=(64, 64, 3),
                               max_images_per_step=1)
    token = new_token()
    backend = ScriptedBackend(toy_oracle_responder(epsilon=0.5), fetch_image=buffer.screenshots.get,
                              delay_s=args.delay_ms / 1000.0)
    ray_start = time.perf_counter()
    ray.init(num_cpus=max(2, args.workers), include_dashboard=False, object_store_memory=80 << 20,
             log_to_driver=False, configure_logging=False)
    ray_init_s = time.perf_counter() - ray_start
    results: dict[str, list[dict]] = {"local": [], "ray": []}
    with TransportServer(backend, token=token, num_threads=max(4, 2 * args.workers)) as server:
        spec = {"worker": {"tasks": ["toy"], "group_size": 2, "max_new_tokens": 64, "prompt": {"window": 0}},
                "policy": {"kind": "remote", "address": server.address, "token": token},
                "buffer": {"path": path}}
        launchers = {"local": lambda: WorkerPool(spec, args.workers),
                     "ray": lambda: RayWorkerPool(spec, args.workers, num_cpus_per_worker=1)}
        for round_index in range(args.rounds):
            order = ("local", "ray") if round_index % 2 == 0 else ("ray", "local")
            for name in order:
                results[name].append(one_round(launchers[name], buffer, args.workers, args.window_s,
                                               args.min_episodes, args.warmup_timeout_s))
    ray.shutdown()

    def total(name, key):
        return sum(r[key] for r in results[name])

    local_rate = 3600.0 * total("local", "episodes") / total("local", "window_s")
    ray_rate = 3600.0 * total("ray", "episodes") / total("ray", "window_s")
    print(json.dumps({
        "benchmark": "ray_overhead", "workers": args.workers, "window_s": args.window_s,
        "min_episodes": args.min_episodes, "rounds": args.rounds,
        "delay_ms": args.delay_ms, "cpu_count": os.cpu_count(), "ray_init_s": round(ray_init_s, 2),
        "local_episodes_per_hour": round(local_rate, 1), "ray_episodes_per_hour": round(ray_rate, 1),
        "overhead": round(1.0 - ray_rate / local_rate, 4) if local_rate else None,
        "target_overhead": 0.10,
        "local_startup_s": [round(r["startup_s"], 2) for r in results["local"]],
        "ray_startup_s": [round(r["startup_s"], 2) for r in results["ray"]],
        "rounds_detail": results,
    }))


if __name__ == "__main__":
    main()
