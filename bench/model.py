"""Benchmark: KV-cache decode vs full recompute, train-step FLOP utilisation, checkpoint-load peak host memory.

    python bench/model.py [--new-tokens 256] [--prompt 1024] [--train-batch 4] [--train-len 256]

Prints one JSON object. Every ratio is measured side by side in this one run (machine load hits both alike):
- decode: greedy generation of `new_tokens` after a `prompt`-token prompt with the KV-cache sampler vs the
  cache-free way (one full forward over the fixed-shape [1, prompt + new_tokens] buffer per new token,
  causal attention makes the right-hand padding irrelevant); compile time excluded from both; 32 recompute
  steps are timed and scaled (each is the same fixed-shape forward). Target ≥ 10×.
- train-step utilisation: jitted value-and-grad + AdamW update of a ~50M-parameter text decoder; model FLOPs
  (6 · matmul params · tokens + 12 · layers · heads · head_dim · T · tokens, PaLM's count) per second ÷ the
  FLOP/s of a plain fp32 [n, n] @ [n, n] matmul measured in this run. Target ≥ 30%.
- load memory: a checkpoint of that preset saved with `save_pretrained`, then `load_pretrained` in a fresh
  subprocess: (peak RSS during the load, sampled every 5 ms, − RSS before it) ÷ checkpoint bytes. Target ≤ 1.2.
  `peak_over_size` is measured after a warm-up load of the tiny checkpoint (one-time runtime growth, ~50 MB,
  excluded); `cold_peak_over_size` includes it. `transient_over_size` = (peak − RSS after) ÷ bytes: what the
  load needed beyond the loaded params themselves (0 = never two copies).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = pathlib.Path(__file__).resolve().parents[1]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jaxwebrl.models.config import TextConfig, tiny_config  # noqa: E402
from jaxwebrl.models.policy import Policy, init_params  # noqa: E402
from jaxwebrl.models.sampler import Sampler, SamplingParams  # noqa: E402


def _timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - start)
    return out


def bench_decode(prompt_len: int, new_tokens: int, repeats: int) -> dict:
    config = tiny_config()
    config = config.replace(text=dataclasses.replace(config.text, max_position_embeddings=prompt_len + new_tokens))
    module, params = init_params(config, seed=0)
    policy = Policy(config, module, params)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 250, prompt_len).astype(np.int32)
    sampler = Sampler(module, config, pad_token_id=0, decode_chunk=64, prompt_multiple=prompt_len)
    greedy = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)

    def cached():
        return sampler.generate((params, 0), [{"input_ids": prompt}], greedy)[0].tokens

    width = prompt_len + new_tokens
    forward = jax.jit(lambda p, ids: module.apply({"params": p}, ids)[0][0])

    def recompute(steps):
        ids = np.zeros((1, width), np.int32)
        ids[0, :prompt_len] = prompt
        for t in range(steps):
            logits = forward(params, jnp.asarray(ids))
            ids[0, prompt_len + t] = int(jnp.argmax(logits[prompt_len + t - 1]))
        return ids[0, prompt_len:prompt_len + steps]

    tokens_cached = cached()  # compiles
    forward(params, jnp.zeros((1, width), jnp.int32)).block_until_ready()
    # Every recompute step is the same fixed-shape forward, so its cost is constant: time `timed_steps` of them
    # and scale to new_tokens (the tokens they produce are checked against the cached run's).
    timed_steps = min(new_tokens, 32)
    cached_s, recompute_s, same = [], [], True
    for _ in range(repeats):  # interleaved
        cached_s += _timed(cached, 1)
        start = time.perf_counter()
        tokens = recompute(timed_steps)
        recompute_s.append((time.perf_counter() - start) * new_tokens / timed_steps)
        same &= bool((tokens == tokens_cached[:timed_steps]).all())
    return {
        "prompt_tokens": prompt_len, "new_tokens": new_tokens,
        "kv_cache_s": min(cached_s), "full_recompute_s": min(recompute_s), "recompute_steps_timed": timed_steps,
        "speedup": min(recompute_s) / min(cached_s), "target_speedup": 10.0, "same_tokens": same,
    }


def preset_50m():
    """A ~50M-parameter Qwen3-VL text decoder (the vision tower stays tiny; the train step is text-only)."""
    base = tiny_config()
    text = TextConfig(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=14, num_heads=8,
                      num_kv_heads=4, head_dim=64, rope_theta=1e6, mrope_section=(8, 12, 12),
                      max_position_embeddings=4096)
    vision = dataclasses.replace(base.vision, out_hidden_size=512)
    return base.replace(text=text, vision=vision, image_token_id=8188, video_token_id=8189, vision_start_token_id=8190,
                        vision_end_token_id=8191)


def _count(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def bench_train_step(batch: int, length: int, repeats: int) -> tuple[dict, tuple]:
    config = preset_50m()
    module, params = init_params(config, seed=0)
    text = config.text
    text_params = _count(params["language_model"]) + (0 if config.tie_word_embeddings else _count(params["lm_head"]))
    # Matmul parameters: every decoder kernel plus the output head (the embedding lookup is not a matmul).
    matmul_params = _count(params["language_model"]["layers_0"]) * text.num_layers + text.vocab_size * text.hidden_size
    tokens = batch * length
    flops = 6 * matmul_params * tokens + 12 * text.num_layers * text.num_heads * text.head_dim * length * tokens
    optimizer = optax.adamw(1e-4)
    opt_state = optimizer.init(params)

    def loss_fn(p, ids):
        logits, _ = module.apply({"params": p}, ids)
        logprobs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.take_along_axis(logprobs, ids[:, 1:, None], axis=-1).mean()

    @jax.jit
    def train_step(p, state, ids):
        loss, grads = jax.value_and_grad(loss_fn)(p, ids)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    ids = jnp.asarray(np.random.default_rng(0).integers(0, 8000, (batch, length)), jnp.int32)
    params_run, state_run, _ = train_step(params, opt_state, ids)  # compiles
    n = 2048
    a = jnp.asarray(np.random.default_rng(1).standard_normal((n, n)), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    step_s, matmul_s = [], []
    for _ in range(repeats):  # interleaved
        step_s += _timed(lambda: train_step(params_run, state_run, ids), 1)
        matmul_s += _timed(lambda: matmul(a), 3)
    model_flops_per_s = flops / min(step_s)
    peak = 2 * n**3 / min(matmul_s)
    result = {
        "text_params": text_params, "matmul_params": matmul_params, "tokens_per_step": tokens,
        "step_s": min(step_s), "step_s_median": statistics.median(step_s), "model_tflops": model_flops_per_s / 1e12,
        "matmul_tflops": peak / 1e12, "utilisation": model_flops_per_s / peak, "target_utilisation": 0.30,
    }
    return result, (config, module, params)


_LOAD_CHILD = r"""
import os, sys, json, threading, time, psutil
import jax
from jaxwebrl.models import hf_io
jax.block_until_ready(jax.numpy.zeros(1))
if len(sys.argv) > 3:  # warm: load a small checkpoint first, so one-time runtime growth is not counted
    jax.block_until_ready(hf_io.load_pretrained(sys.argv[3], dtype="float32", with_processor=False).params)
proc = psutil.Process()
before = proc.memory_info().rss
samples, stop = [before], threading.Event()
def sample():  # ru_maxrss is inherited from the parent across fork/exec on Linux, so sample RSS instead
    while not stop.is_set():
        samples.append(proc.memory_info().rss)
        time.sleep(0.005)
thread = threading.Thread(target=sample)
thread.start()
policy = hf_io.load_pretrained(sys.argv[1], dtype="float32", with_processor=False)
jax.block_until_ready(policy.params)
stop.set()
thread.join()
after = proc.memory_info().rss
print(json.dumps({"rss_before": before, "peak": max(samples + [after]), "rss_after": after}))
"""


def bench_load_memory(config, module, params) -> dict:
    from jaxwebrl.models import hf_io
    from jaxwebrl.models.policy import tiny_policy

    def child(*dirs):
        run = subprocess.run([sys.executable, "-c", _LOAD_CHILD, dirs[0], str(REPO), *dirs[1:]], capture_output=True,
                             text=True, check=True, env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
        return json.loads(run.stdout.strip().splitlines()[-1])

    with tempfile.TemporaryDirectory() as out_dir, tempfile.TemporaryDirectory() as small_dir:
        hf_io.save_pretrained(Policy(config, module, params), out_dir)
        tiny = tiny_policy(seed=0)
        hf_io.save_pretrained(Policy(tiny.config, tiny.module, tiny.params), small_dir)
        size = sum(f.stat().st_size for f in pathlib.Path(out_dir).glob("*.safetensors"))
        cold, warm = child(out_dir), child(out_dir, small_dir)
    return {
        "checkpoint_bytes": size,
        "peak_over_size": (warm["peak"] - warm["rss_before"]) / size,
        "transient_over_size": (warm["peak"] - warm["rss_after"]) / size,
        "cold_peak_over_size": (cold["peak"] - cold["rss_before"]) / size,
        "cold_transient_over_size": (cold["peak"] - cold["rss_after"]) / size,
        "target_peak_over_size": 1.2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--train-batch", type=int, default=2)
    parser.add_argument("--train-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    start = time.perf_counter()
    decode = bench_decode(args.prompt, args.new_tokens, args.repeats)
    train, model = bench_train_step(args.train_batch, args.train_len, args.repeats)
    load = bench_load_memory(*model)
    print(json.dumps({"bench": "model", "device": jax.devices()[0].device_kind, "decode": decode, "train_step": train,
                      "load_memory": load, "wall_s": time.perf_counter() - start}, indent=1))


if __name__ == "__main__":
    main()
