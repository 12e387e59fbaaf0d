r"""The JAX policy server and the vLLM engine side by side on the same tiny policy (tiny_hd32, the toy env).

For each engine and worker count: the server in this process (as the trainer builds it), that many real rollout
worker processes, a warm-up, then a measured window (both counted in browser steps: bench/rollout.py's `Window`);
per browser step from the workers' own clocks, the generate
round trip they waited (p50 / p95), generated tokens a second, the prefix-cache hit rate (vLLM's counters), and
the seconds of `set_weights` (a push: for vLLM the HF arrays through the socket, the reload, the three cache
resets), timed `--pushes` times after the window. One engine at a time. JSON on stdout.

    python bench/engines.py --workers=2,8,16,32 --window_steps=1000
    python bench/engines.py --engines=vllm --workers=2 --window_steps=500
    python bench/engines.py --train=toy,tiny --train_steps=8    # whole runs: seconds an update, jax vs vllm

`--train` runs `launch/train.py` (grpo recipe, that variant, tiny_hd32) once per engine instead of the window, and
reports the seconds between updates (the median after the first update, whose compile it leaves out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from learning_run import run   # bench/learning_run.py
from rollout import Window, _new_steps, apply_overrides, step_table   # bench/rollout.py


def measure(engine: str, num_workers: int, warmup_steps: int, window_steps: int, max_wait_s: float, pushes: int,
            overrides: list[str]) -> dict:
    from configs.constT10 import get_config
    from jaxwebrl.buffer import from_config as run_buffer
    from jaxwebrl.checkpoint.policies import recipe_policy
    from jaxwebrl.rollout.pool import WorkerPool
    from jaxwebrl.rollout.serving import PolicyService
    from jaxwebrl.rollout.spec import worker_spec

    config = get_config("toy")
    config.model.name = "tiny_hd32"
    config.rollout.engine = engine
    config.rollout.num_workers = num_workers
    config.rollout.server_max_batch = max(8, num_workers)
    apply_overrides(config, overrides)
    policy = recipe_policy(config)
    with tempfile.TemporaryDirectory(prefix="bench_engines_") as root:
        buffer = run_buffer.open_or_create(config, root, policy.config.text.vocab_size)
        start_s = time.monotonic()
        with PolicyService.for_policy(policy, buffer, config, host="127.0.0.1", num_clients=num_workers) as service:
            service.start()
            server = service.server
            started_s = time.monotonic() - start_s
            stats_dir = os.path.join(root, "stats")
            spec = worker_spec(config, buffer_path=run_buffer.path_for(config, root), address=service.address,
                               token=service.token, stats_dir=stats_dir)
            with WorkerPool(spec, num_workers) as pool:
                steps_window = Window(stats_dir, warmup_steps, window_steps, max_wait_s, check=pool.raise_if_failed)
                before = steps_window.open()
                server_before = server.stats()
                engine_before = server.engine_stats() if engine == "vllm" else {}
                after, window = steps_window.close()
                server_after = server.stats()
                engine_after = server.engine_stats() if engine == "vllm" else {}
            push_s = []
            for version in range(1, pushes + 1):
                t0 = time.perf_counter()
                server.set_weights(policy.params, version)
                push_s.append(time.perf_counter() - t0)
    generate = step_table(_new_steps(after, before))["generate_s"]
    generate = generate[np.isfinite(generate)]
    tokens = server_after["generated_tokens"] - server_before["generated_tokens"]
    out = {"engine": engine, "num_workers": num_workers, "window_steps": window_steps, "window_s": round(window, 1),
           "steps": int(len(generate)),
           "server_start_s": round(started_s, 2),
           "generate_p50_s": float(np.median(generate)) if len(generate) else None,
           "generate_p95_s": float(np.percentile(generate, 95)) if len(generate) else None,
           "generated_tokens_per_s": round(tokens / window, 1) if window else None,
           "push_s": [round(s, 4) for s in push_s], "overrides": overrides}
    queries = engine_after.get("prefix_cache_queries", 0) - engine_before.get("prefix_cache_queries", 0)
    hits = engine_after.get("prefix_cache_hits", 0) - engine_before.get("prefix_cache_hits", 0)
    if engine == "vllm":
        out["prefix_cache_hit_rate"] = round(hits / queries, 3) if queries else None
    return out


def train_run(engine: str, variant: str, steps: int, overrides: list[str]) -> dict:
    """One `launch/train.py` run of `configs/grpo.py:<variant>` on tiny_hd32 with `engine`: seconds an update."""
    from jaxwebrl.train.metrics import read_metrics

    with tempfile.TemporaryDirectory(prefix="bench_engines_train_") as workdir:
        wall_s = run([sys.executable, "launch/train.py", f"--config=configs/grpo.py:{variant}", f"--workdir={workdir}",
                      "--config.model.name=tiny_hd32", f"--config.rollout.engine={engine}",
                      f"--config.train.max_steps={steps}", "--config.metrics.progress_bar=False", *overrides])
        times = [r["time"] for r in read_metrics(workdir)]
    gaps = np.diff(times)
    return {"engine": engine, "variant": variant, "updates": len(times), "wall_s": round(wall_s, 1),
            "s_per_update_median": round(float(np.median(gaps)), 2) if len(gaps) else None,
            "s_per_update_p95": round(float(np.percentile(gaps, 95)), 2) if len(gaps) else None,
            "overrides": overrides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="jax,vllm")
    parser.add_argument("--workers", default="2,8,16,32")
    parser.add_argument("--warmup_steps", type=int, default=50, help="steps before the window (compiles)")
    parser.add_argument("--window_steps", type=int, default=1000, help="steps measured per engine and worker count")
    parser.add_argument("--max_wait_s", type=float, default=1800.0, help="a window not filled by then is an error")
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--train", default="", help="recipe variants to train (toy,tiny) instead of the window")
    parser.add_argument("--train_steps", type=int, default=8)
    parser.add_argument("--out", default="", help="also write the JSON here")
    args, overrides = parser.parse_known_args()
    if args.train:
        results = [train_run(engine, variant, args.train_steps, overrides)
                   for variant in args.train.split(",") for engine in args.engines.split(",")]
        report = {"bench": "engines_train", "policy": "tiny_hd32", "recipe": "grpo", "results": results}
    else:
        results = [measure(engine, int(n), args.warmup_steps, args.window_steps, args.max_wait_s, args.pushes,
                           overrides)
                   for n in args.workers.split(",") for engine in args.engines.split(",")]
        report = {"bench": "engines", "policy": "tiny_hd32", "env": "toy", "results": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
