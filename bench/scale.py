"""Real-width rehearsal on the CPU: the whole loop at Qwen3-VL-2B widths and vocabulary, measured.

    python bench/scale.py [--steps=2] [--config.a.b=v ...]

Runs `launch/train.py --config=configs/constT10.py:rehearsal` (Qwen3-VL-2B hidden/heads/MLP widths, the
151,936-row vocabulary with the real Qwen tokenizer, real vision patch and merge sizes, 2 decoder layers and 2
vision blocks, random weights; MiniWoB++ in headless Chromium at 1280x720; free-form tool-call actions) through
the browser -> policy server -> ring buffer -> trainer loop for `--steps` train steps, and prints one JSON
object: peak RSS of the run's process tree (trainer + policy server + rollout worker + Chromium), image tokens per
screenshot, prompt and response lengths from the buffer, the wall time to each train step, and the time to build
the project's action grammar (the click-grid trie of `env/agent/action_space.py`) over the 151k vocabulary (the
rehearsal decodes free-form, so this is measured on its own).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree_rss(proc) -> int:
    """Resident bytes of `proc` and all its descendants (0 for processes that just exited)."""
    import psutil

    total = 0
    try:
        for p in [proc] + proc.children(recursive=True):
            try:
                total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
    except psutil.NoSuchProcess:
        pass
    return total


def run_loop(workdir: str, steps: int, overrides: list[str], timeout_s: float, max_rss_gib: float) -> dict:
    """launch/train.py on the rehearsal variant; (exit code, peak tree RSS, wall time, output tail). The run is
    stopped (SIGTERM, then SIGKILL) past `timeout_s` or when its process tree holds more than `max_rss_gib`."""
    import psutil

    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), "--config=configs/constT10.py:rehearsal",
           f"--workdir={workdir}", f"--config.train.max_steps={steps}", "--config.metrics.progress_bar=False",
           *overrides]
    log_path = os.path.join(workdir, "run.log")
    os.makedirs(workdir, exist_ok=True)
    start = time.time()
    with open(log_path, "w") as log:
        popen = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        proc, peak, stopped = psutil.Process(popen.pid), 0, None
        try:
            while popen.poll() is None:
                rss = _tree_rss(proc)
                peak = max(peak, rss)
                if time.time() - start > timeout_s or rss > max_rss_gib * 2**30:
                    stopped = "timeout" if rss <= max_rss_gib * 2**30 else f"rss above {max_rss_gib} GiB"
                    for child in proc.children(recursive=True):
                        try:
                            child.kill()
                        except psutil.NoSuchProcess:
                            pass
                    popen.kill()
                    popen.wait(60)
                    break
                time.sleep(0.5)
        finally:
            if popen.poll() is None:
                popen.kill()
                popen.wait()
    with open(log_path) as f:
        tail = f.read()[-3000:]
    return {"returncode": popen.returncode, "peak_rss_bytes": peak, "wall_s": time.time() - start,
            "started": start, "output_tail": tail, "stopped": stopped}


def buffer_stats(workdir: str, config) -> dict:
    """Prompt/response lengths and image tokens per screenshot of the episodes the run wrote."""
    import numpy as np

    from jaxwebrl.buffer.ring import RingBuffer
    from jaxwebrl.models import presets

    model_config = presets.model_config(config.model)
    image_id = model_config.image_token_id
    buffer = RingBuffer.open(os.path.join(workdir, "buffer"))
    episodes, _ = buffer.read(None)
    prompts, responses, image_tokens, max_id = [], [], [], -1
    for e in episodes:
        for ids, mask, refs in ((s.input_ids, s.loss_mask, s.screenshot_refs) for s in e.steps):
            responses.append(int(np.sum(mask)))
            max_id = max(max_id, int(np.max(ids)))
            prompts.append(int(len(ids) - np.sum(mask)))
            images = int(np.sum(np.asarray(refs) >= 0))
            if images:
                image_tokens.append(int(np.sum(np.asarray(ids) == image_id)) // images)
    grid = presets.image_processor_for(model_config).grid_thw(config.env.screenshot_height, config.env.screenshot_width)
    expected = int(np.prod(grid)) // model_config.vision.spatial_merge_size ** 2

    def summary(xs):
        return {"min": min(xs), "mean": float(np.mean(xs)), "max": max(xs)} if xs else None

    # the vocabulary the run used: the width its buffer was created for (the policy's embedding rows) and the
    # largest id its episodes hold (the Qwen special tokens sit above 151,642)
    return {"episodes": len(episodes), "step_rows": len(prompts), "prompt_tokens": summary(prompts),
            "buffer_vocab_size": int(buffer.config.vocab_size), "max_token_id": max_id,
            "response_tokens": summary(responses), "image_tokens_per_screenshot": summary(image_tokens),
            "image_tokens_per_screenshot_expected": expected, "image_grid_thw": [int(g) for g in grid]}


def grammar_build_seconds(config) -> dict:
    """Build time of the click-grid action grammar over the real vocabulary (what a constrained run builds)."""
    from jaxwebrl.models import presets
    from jaxwebrl.env.agent.action_space import CLICK_GRID
    from jaxwebrl.rollout.action_grammar import action_constraint

    model_config = presets.model_config(config.model)
    processor = presets.processor_for(model_config)
    start = time.perf_counter()
    constraint = action_constraint(processor, CLICK_GRID, model_config.text.vocab_size)
    return {"grammar_build_s": time.perf_counter() - start, "grammar_states": int(constraint.allowed.shape[0]),
            "grammar_vocab": int(constraint.allowed.shape[1]), "grammar_actions": len(CLICK_GRID),
            "grammar_used_by_run": bool(config.model.constrained_actions)}


def rehearsal_config(overrides: list[str]):
    from configs.constT10 import get_config

    config = get_config("rehearsal")
    for item in overrides:
        key, _, value = item[len("--config."):].partition("=")
        node = config
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        current = node[leaf]
        node[leaf] = type(current)(value) if current is not None and not isinstance(current, bool) else \
            (value.lower() == "true" if isinstance(current, bool) else value)
    return config


def measure(workdir: str, steps: int = 2, overrides: list[str] | None = None, timeout_s: float = 3000,
            max_rss_gib: float = 16.0) -> dict:
    from jaxwebrl.models import presets
    from jaxwebrl.train.metrics import read_metrics

    overrides = list(overrides or [])
    config = rehearsal_config(overrides)
    model_config = presets.model_config(config.model)
    run = run_loop(workdir, steps, overrides, timeout_s, max_rss_gib)
    out = {"variant": "rehearsal", "steps_requested": steps, "returncode": run["returncode"],
           "peak_rss_bytes": run["peak_rss_bytes"], "peak_rss_gib": run["peak_rss_bytes"] / 2**30,
           "wall_s": run["wall_s"]}
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    records = read_metrics(workdir) if os.path.exists(metrics_path) else []
    times = [r["time"] for r in records]
    out["steps_done"] = len(records)
    out["seconds_to_each_step"] = [t - run["started"] for t in times]     # the first includes start-up + compile
    out["step_s"] = [b - a for a, b in zip(times, times[1:])]
    if os.path.isdir(os.path.join(workdir, "buffer")):
        out.update(buffer_stats(workdir, config))
    out.update(grammar_build_seconds(config))
    out["model"] = {"preset": config.model.preset, "num_layers": config.model.num_layers,
                    "vision_depth": config.model.vision_depth, "vocab_size": model_config.text.vocab_size,
                    "screenshot": [config.env.screenshot_width, config.env.screenshot_height]}
    if run["returncode"] != 0:
        out["output_tail"] = run["output_tail"]
        out["stopped"] = run["stopped"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--timeout_s", type=float, default=3000)
    parser.add_argument("--max_rss_gib", type=float, default=20.0,
                        help="stop the run past this much memory (it peaks at ~18 GiB: the machine needs 24)")
    args, overrides = parser.parse_known_args()
    bad = [o for o in overrides if not o.startswith("--config.")]
    if bad:
        parser.error(f"unknown arguments {bad}: pass config overrides as --config.a.b=value")
    workdir = args.workdir or tempfile.mkdtemp(prefix="jaxwebrl_rehearsal_")
    result = measure(workdir, args.steps, overrides, args.timeout_s, args.max_rss_gib)
    result["workdir"] = workdir
    print(json.dumps(result))
    return 0 if result["returncode"] == 0 and result["steps_done"] >= args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
