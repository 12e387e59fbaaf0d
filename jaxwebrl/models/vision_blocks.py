"""Vision-tower pieces shared by the Qwen-VL families: 2-D rotary, segment (block-diagonal) attention, the patch
merger."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxwebrl.models.attention import AttentionMask, attend, attend_unmasked
from jaxwebrl.models.config import VisionConfig
from jaxwebrl.models.layers import RMSNorm, apply_rotary, dense, inverse_frequencies, layer_norm, remat_policy
from jaxwebrl.parallel.mesh import constrain_batch


def vision_rotary(positions: np.ndarray, head_dim: int, theta: float):
    """2-D rotary tables for patches. positions [N, 2] (row, col) -> cos, sin [N, head_dim] float32.

    Half of the frequencies rotate by the row, half by the column (same frequency set for both).
    """
    inv = inverse_frequencies(head_dim // 2, theta)  # [head_dim // 4]
    freqs = jnp.asarray(positions, jnp.float32)[..., None] * inv  # [N, 2, head_dim // 4]
    freqs = freqs.reshape(freqs.shape[0], -1)  # row freqs then col freqs
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def segment_attention(q, k, v, layout: dict, scale: float, chunk: int = 0, kernel: str = "auto"):
    """Attention restricted to segments. q/k/v [N, H, D]; layout from `vision_layout.segment_layout`.

    Returns [N, H, D]: each row attends only to the rows of its own segment. Segments of one length (every
    screenshot the same size, a recipe's case) are a reshape [S, L, H, D], not a gather, and plain batched
    attention on `kernel` (`attention.attend_unmasked`: no mask, no padding; cuDNN or splash on an accelerator):
    the rows' batch sharding carries over to the segments, so each device attends over its own images only (a
    gather with an index table made XLA replicate every image's attention on every device; under `jax.set_mesh`
    the segments are also pinned to the batch axes, which XLA otherwise leaves to the weights' `fsdp` sharding).
    Segments of mixed lengths are gathered into a padded [S, L] layout and run on XLA with a key mask (queries
    `chunk` at a time when chunk > 0).
    """
    segments, width = layout["gather"].shape
    if segments * width == q.shape[0]:
        split = lambda x: constrain_batch(x.reshape(segments, width, *x.shape[1:]))
        return attend_unmasked(split(q), split(k), split(v), scale, chunk, kernel).reshape(q.shape)
    gather = jnp.asarray(layout["gather"])
    valid = jnp.asarray(layout["valid"])
    qs, ks, vs = q[gather], k[gather], v[gather]  # [S, L, H, D]
    out = attend(qs, ks, vs, AttentionMask(valid), scale, chunk)
    out = out.reshape(-1, *out.shape[2:])
    return out[jnp.asarray(layout["scatter"])]


def block_class(block, remat: str, *, scanned: bool = False):
    """`block` (a vision block module class) under the `remat` policy (inside `nn.scan` when `scanned`)."""
    return block if remat == "none" else nn.remat(block, policy=remat_policy(remat), prevent_cse=not scanned)


class VisionAttention(nn.Module):
    """Fused-qkv self-attention over patches with 2-D rotary and segment masking, on kernel `attention_impl`."""

    dim: int
    num_heads: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_chunk: int = 0
    attention_impl: str = "auto"

    @nn.compact
    def __call__(self, x, cos, sin, layout):
        """x [N, dim]; cos/sin [N, head_dim] f32 -> [N, dim]."""
        n = x.shape[0]
        head_dim = self.dim // self.num_heads
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        qkv = checkpoint_name(dense(3 * self.dim, use_bias=True, name="qkv", **kw)(x), "qkv_proj")
        qkv = qkv.reshape(n, 3, self.num_heads, head_dim)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
        q = apply_rotary(q, cos[:, None, :], sin[:, None, :])
        k = apply_rotary(k, cos[:, None, :], sin[:, None, :])
        out = segment_attention(q, k, v, layout, head_dim**-0.5, self.attention_chunk, self.attention_impl)
        out = checkpoint_name(out, "attention_out")   # names a remat policy keeps (`layers.REMAT_POLICIES`)
        return checkpoint_name(dense(self.dim, use_bias=True, name="proj", **kw)(out.reshape(n, self.dim)), "out_proj")


def activation(name: str):
    """transformers ACT2FN names used by Qwen-VL vision towers."""
    table = {
        "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "silu": jax.nn.silu,
        "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    }
    if name not in table:
        raise ValueError(f"vision hidden_act {name!r} is not supported; expected one of {sorted(table)}")
    return table[name]


class PatchMerger(nn.Module):
    """Each merge x merge block of patches concatenated and projected to the text width: x [N, hidden] ->
    [N / merge^2, out_hidden] (norm, fc1, exact GELU, fc2). `norm`: "layer" (Qwen3-VL's LayerNorm) or "rms"
    (Qwen2.5-VL's RMSNorm); `postshuffle_norm` (Qwen3-VL's DeepStack mergers) normalises the concatenated vector
    instead of each patch; `names`: the (norm, fc1, fc2) params as the family's checkpoint names them."""

    config: VisionConfig
    norm: str = "layer"
    postshuffle_norm: bool = False
    names: tuple = ("norm", "linear_fc1", "linear_fc2")
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        width = c.hidden_size * c.spatial_merge_size**2
        norm_name, fc1, fc2 = self.names
        if self.norm == "rms":
            normalise = RMSNorm(width if self.postshuffle_norm else c.hidden_size, 1e-6, name=norm_name, **kw)
        else:
            normalise = layer_norm(norm_name, **kw)
        x = normalise(x.reshape(-1, width)) if self.postshuffle_norm else normalise(x).reshape(-1, width)
        x = jax.nn.gelu(dense(width, use_bias=True, name=fc1, **kw)(x), approximate=False)
        return dense(c.out_hidden_size, use_bias=True, name=fc2, **kw)(x)
