"""The attention kernels by name, the rule that picks one per backend, and the two accelerator kernels.

`model.attention_impl` (MaxText's `attention:` knob) names the kernel of the no-cache causal forward (the
trainer's rows) and of the vision tower's images:

  "xla"      dense masked attention (`layers.masked_attention`): fp32 [B, H, T, S] scores; the reference
  "chunked"  the same, `model.attention_chunk` queries at a time (each chunk checkpointed): memory O(chunk x S)
  "cudnn"    `jax.nn.dot_product_attention(..., implementation="cudnn")`: cuDNN flash attention (GPU, bf16/fp16)
  "splash"   Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`, TPU), with a causal
             or full mask and `SegmentIds` for padding and packed rows, as Tunix and MaxText call it
  "auto"     per backend: gpu -> cudnn (bf16/fp16 compute; fp32 falls back), tpu -> splash, cpu -> chunked
             when attention_chunk > 0, else xla

`select_attention_kernel(requested, backend, dtype=, chunk=)` is that rule, a pure function. The KV-cache masks
(prefill over a cache, decode) always run on XLA (`attention.attend`).

Why JAX's own kernels and not tokamax (Google's Pallas kernel library, 0.0.17 on PyPI, which wraps both): every
tokamax release since 0.0.13 requires Python >= 3.12 (`pip download tokamax==0.0.17` refuses this machine's
3.11), so it cannot be installed, let alone checked at the pinned JAX 0.10.2 here and at 0.11.2 on the GPU
machine; cuDNN through `jax.nn.dot_product_attention` and splash through `jax.experimental.pallas` ship with
jax itself, at both versions, and need no new dependency.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp

from jaxwebrl.parallel.mesh import BATCH_AXES

KERNELS = ("auto", "xla", "chunked", "cudnn", "splash")
CUDNN_DTYPES = ("bfloat16", "float16")   # what cuDNN flash attention computes in
SPLASH_LANES = 128                       # splash tiles the sequence in blocks of a multiple of this
_GPU_BACKENDS = ("gpu", "cuda")


def kernel_problem(kernel: str, *, dtype, chunk: int) -> str | None:
    """Why `kernel` cannot run at compute `dtype` and `chunk` on any backend (one line naming the fix), or None."""
    if kernel not in KERNELS:
        return f"attention_impl={kernel!r}: use one of {', '.join(KERNELS)}"
    if kernel == "cudnn" and jnp.dtype(dtype).name not in CUDNN_DTYPES:
        return (f"attention_impl='cudnn': cuDNN flash attention computes in bf16/fp16, the model computes in "
                f"{jnp.dtype(dtype).name}: set model.dtype=bfloat16, or attention_impl='auto'")
    if kernel == "chunked" and chunk <= 0:
        return "attention_impl='chunked' needs model.attention_chunk > 0 (e.g. 1024), or attention_impl='xla'"
    return None


def select_attention_kernel(requested: str, backend: str, *, dtype, chunk: int) -> str:
    """The concrete kernel ("xla", "chunked", "cudnn", "splash") for `requested` on `backend` ("cpu", "gpu",
    "tpu"; `jax.default_backend()`) at compute `dtype` with `attention_chunk` = chunk. ValueError (one line)
    when an explicitly named kernel cannot run there."""
    problem = kernel_problem(requested, dtype=dtype, chunk=chunk)
    if problem is not None:
        raise ValueError(problem)
    if requested == "auto":
        if backend in _GPU_BACKENDS and jnp.dtype(dtype).name in CUDNN_DTYPES:
            return "cudnn"
        if backend == "tpu":
            return "splash"
        return "chunked" if chunk > 0 else "xla"
    if requested == "cudnn" and backend not in _GPU_BACKENDS:
        raise ValueError(f"attention_impl='cudnn' needs a GPU, the backend is {backend!r}: use 'auto' (or 'xla')")
    if requested == "splash" and backend != "tpu":
        raise ValueError(f"attention_impl='splash' needs a TPU, the backend is {backend!r}: use 'auto' (or 'xla')")
    return requested


def config_kernel(config, backend: str | None = None) -> str:
    """The kernel a ModelConfig's `attention_impl` runs on `backend` (default: this process's JAX backend)."""
    return select_attention_kernel(config.attention_impl, backend or jax.default_backend(), dtype=config.dtype,
                                   chunk=config.attention_chunk)


# ----------------------------------------------------------------------------------------------------- cuDNN


def cudnn_attention(q, k, v, scale: float, *, causal: bool, lengths=None, segment_ids=None,
                    implementation: str = "cudnn") -> jax.Array:
    """q [B, T, H, D], k/v [B, S, K, D] (same dtype, bf16/fp16 for cuDNN) -> [B, T, H, D] in q.dtype.

    `lengths` [B] int32: every row's real tokens come first (right padding), queries and keys alike;
    `segment_ids` [B, T] int32 (T == S): packed rows, a query sees only its own segment's keys (handed to cuDNN as
    a [B, 1, T, S] mask, which it applies as a bias). `implementation="xla"` runs the same call on JAX's XLA
    kernel (what the CPU tests check the arguments with)."""
    mask = None
    if segment_ids is not None:
        mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask, scale=scale,
                                       is_causal=causal, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                                       implementation=implementation)
    return out.astype(q.dtype)


CUDNN_CALL = re.compile(r'custom_call_target="(__cudnn\$fmha[A-Za-z0-9]*)"')


def cudnn_attention_calls(hlo_text: str) -> dict[str, int]:
    """{"forward": n, "backward": n}: the cuDNN fused-attention custom calls (`__cudnn$fmha...`) in a compiled
    program's HLO text (`compiled.as_text()`)."""
    targets = CUDNN_CALL.findall(hlo_text)
    backward = sum("Backward" in target for target in targets)
    return {"forward": len(targets) - backward, "backward": backward}


# ---------------------------------------------------------------------------------------------------- splash


def _block(length: int) -> int:
    """The largest splash block (512, 256 or 128) that divides `length` (a multiple of SPLASH_LANES)."""
    return next(b for b in (512, 256, SPLASH_LANES) if length % b == 0)


def _splash_rows(q, k, v, q_ids, kv_ids, *, causal: bool, interpret: bool):
    """Splash over rows: q [B, H, T, D] (already scaled), k/v [B, K, T, D], ids [B, T] int32, T a multiple of
    SPLASH_LANES -> [B, H, T, D]."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash  # deferred: Pallas' TPU ops, TPU only

    heads, t = q.shape[1], q.shape[2]
    one = splash.CausalMask((t, t)) if causal else splash.FullMask((t, t))
    n = _block(t)
    blocks = splash.BlockSizes(block_q=n, block_kv=n, block_kv_compute=n, block_q_dkv=n, block_kv_dkv=n,
                               block_kv_dkv_compute=n, block_q_dq=n, block_kv_dq=n)
    kernel = splash.make_splash_mha(splash.MultiHeadMask((one,) * heads), block_sizes=blocks, head_shards=1,
                                    q_seq_shards=1, interpret=interpret)
    return jax.vmap(kernel)(q, k, v, splash.SegmentIds(q_ids, kv_ids))


def splash_attention(q, k, v, scale: float, *, causal: bool, key_valid=None, segment_ids=None,
                     interpret: bool = False) -> jax.Array:
    """Self-attention q [B, T, H, D], k/v [B, T, K, D] -> [B, T, H, D] in q.dtype, through the splash kernel.

    `key_valid` [B, T] bool: padding (anywhere in the row) is a segment of its own, so a real token never sees
    it; `segment_ids` [B, T] int32: packed rows. Both become splash `SegmentIds`; T is padded up to a multiple of
    128 (that padding too a segment of its own). Under a mesh (`jax.set_mesh`) the kernel runs per shard
    (`shard_map`: rows over the batch axes, heads over `tensor` where they divide): XLA does not partition a
    Pallas call, so a program over several devices must set its mesh; with none in context the kernel is called
    as it is (one device). `interpret=True` runs the kernel in Pallas' interpreter (any backend: the CPU tests)."""
    b, t = q.shape[:2]
    kv_heads = k.shape[2]
    ids = jnp.zeros((b, t), jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    if key_valid is not None:
        ids = jnp.where(key_valid, ids, jnp.iinfo(jnp.int32).min)
    pad = -t % SPLASH_LANES
    ids = jnp.pad(ids, ((0, 0), (0, pad)), constant_values=jnp.iinfo(jnp.int32).min + 1)
    scaled = (q.astype(jnp.float32) * scale).astype(q.dtype)
    heads_major = lambda x: jnp.pad(jnp.swapaxes(x.astype(q.dtype), 1, 2), ((0, 0), (0, 0), (0, pad), (0, 0)))
    run = lambda *xs: _splash_rows(*xs, causal=causal, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and math.prod(mesh.shape.values()) > 1:
        batch = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
        rows = batch if batch and b % math.prod(mesh.shape[a] for a in batch) == 0 else None
        heads = "tensor" if "tensor" in mesh.axis_names and kv_heads % mesh.shape["tensor"] == 0 else None
        spec = jax.sharding.PartitionSpec(rows, heads, None, None)
        ids_spec = jax.sharding.PartitionSpec(rows, None)
        run = jax.shard_map(run, mesh=mesh, in_specs=(spec,) * 3 + (ids_spec,) * 2, out_specs=spec,
                            check_vma=False)
    out = run(heads_major(scaled), heads_major(k), heads_major(v), ids, ids)
    return jnp.swapaxes(out[:, :, :t], 1, 2).astype(q.dtype)
