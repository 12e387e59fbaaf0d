"""Attention alone on the local accelerator: the train step's two attention shapes through every kernel that
runs here, forward + backward, each next to the XLA reference (part of bench/device_check.sh).

    python bench/attention_check.py            # Qwen3-VL-2B shapes, bf16
    python bench/attention_check.py --tiny     # small shapes on the CPU: checks the script itself

Shapes: `text` is the decoder's causal right-padded rows (8 x 4,096 tokens, 16 query / 8 KV heads of 128; rows
of 4,096, 3,385 and 2,342 real tokens), `vision` the tower's same-sized images (8 images x 3,520 patches of a
1280x720 screenshot, 16 heads of 64, no mask). Kernels: xla (dense), chunked (`--chunk` queries at a time),
cudnn on a GPU, splash on a TPU (`models/attention_kernels.py`); one that cannot run here is reported with the
reason, not timed. Each entry: median ms of `jit(grad(sum(attend(q, k, v) * w)))` over `--iters`, its speed-up
over xla, and the largest difference of its output and of dq from xla's (fp32 for the reference). Prints one JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

SHAPES = {   # name: (batch, tokens, query heads, kv heads, head dim, causal)
    "text": (8, 4096, 16, 8, 128, True),
    "vision": (8, 3520, 16, 16, 64, False),
}
TINY_SHAPES = {"text": (2, 96, 4, 2, 16, True), "vision": (3, 80, 4, 4, 16, False)}


def _inputs(shape, dtype, key):
    import jax
    import jax.numpy as jnp

    b, t, h, kv, d, causal = shape
    kq, kk, kvv, kw = jax.random.split(key, 4)
    q = jax.random.normal(kq, (b, t, h, d), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (b, t, kv, d), jnp.float32).astype(dtype)
    v = jax.random.normal(kvv, (b, t, kv, d), jnp.float32).astype(dtype)
    w = jax.random.normal(kw, (b, t, h, d), jnp.float32)
    lengths = jnp.array([t, int(t * 0.83), int(t * 0.57)] * b, jnp.int32)[:b]   # right-padded rows
    valid = jnp.arange(t)[None, :] < lengths[:, None]
    return q, k, v, w, valid


def _program(kernel: str, causal: bool, chunk: int, scale: float):
    """jit(value_and_grad) of sum(attend(q, k, v) * w) in fp32 over q."""
    import jax
    import jax.numpy as jnp

    from jaxwebrl.models.attention import attend, attend_unmasked, causal_mask

    def loss(q, k, v, w, valid):
        if causal:
            out = attend(q, k, v, causal_mask(valid), scale, chunk, kernel)
        else:
            out = attend_unmasked(q, k, v, scale, chunk, kernel)
        if causal:
            out = jnp.where(valid[:, :, None, None], out, 0)
        return jnp.sum(out.astype(jnp.float32) * w), out

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def _median_ms(fn, args, iters: int) -> tuple[float, float]:
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    times.sort()
    return 1000 * times[len(times) // 2], compile_s


def check(name: str, shape, kernels, *, dtype, chunk: int, iters: int, backend: str) -> dict:
    import jax
    import jax.numpy as jnp

    from jaxwebrl.models.attention_kernels import select_attention_kernel

    causal = shape[-1]
    scale = shape[4] ** -0.5
    q, k, v, w, valid = _inputs(shape, dtype, jax.random.PRNGKey(0))
    ref_fn = _program("xla", causal, 0, scale)
    ((_, ref_out), ref_dq) = ref_fn(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), w, valid)
    entry = {"shape": dict(zip(("batch", "tokens", "heads", "kv_heads", "head_dim", "causal"), shape)),
             "kernels": {}}
    for kernel in kernels:
        try:
            select_attention_kernel(kernel, backend, dtype=dtype, chunk=chunk)
        except ValueError as err:
            entry["kernels"][kernel] = {"skipped": str(err)}
            continue
        fn = _program(kernel, causal, chunk, scale)
        try:
            ms, compile_s = _median_ms(fn, (q, k, v, w, valid), iters)
            (_, out), dq = fn(q, k, v, w, valid)
        except Exception as err:  # noqa: BLE001 - one kernel failing still reports the others
            entry["kernels"][kernel] = {"error": f"{type(err).__name__}: {err}"[:500]}
            continue
        mask = valid[:, :, None, None] if causal else True
        entry["kernels"][kernel] = {
            "ms": round(ms, 3), "compile_s": round(compile_s, 2),
            "max_abs_diff_out": float(jnp.max(jnp.where(mask, jnp.abs(out.astype(jnp.float32) - ref_out), 0))),
            "max_abs_diff_dq": float(jnp.max(jnp.where(mask, jnp.abs(dq.astype(jnp.float32) - ref_dq), 0))),
        }
    base = entry["kernels"].get("xla", {}).get("ms")
    for result in entry["kernels"].values():
        if base and "ms" in result:
            result["speedup_over_xla"] = round(base / result["ms"], 3)
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small shapes (a CPU smoke test of the script)")
    parser.add_argument("--kernels", default="xla,chunked,cudnn,splash")
    parser.add_argument("--chunk", type=int, default=None, help="queries per chunk (default 1024; tiny 32)")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp

    backend = jax.default_backend()
    dtype = jnp.float32 if args.tiny else jnp.bfloat16
    chunk = args.chunk if args.chunk is not None else (32 if args.tiny else 1024)
    shapes = TINY_SHAPES if args.tiny else SHAPES
    kernels = [name for name in args.kernels.split(",") if name]
    result = {"program": "attention", "backend": backend, "device": jax.devices()[0].device_kind,
              "dtype": jnp.dtype(dtype).name, "chunk": chunk, "iters": args.iters,
              "shapes": {name: check(name, shape, kernels, dtype=dtype, chunk=chunk, iters=args.iters,
                                     backend=backend) for name, shape in shapes.items()}}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
