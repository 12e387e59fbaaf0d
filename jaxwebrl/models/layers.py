"""Layers shared by the Qwen-VL families: RMSNorm, SwiGLU MLP, rotary helpers (fp32), masked attention.

Everything here is numerically aligned with the transformers reference: norms and softmax run in fp32 and
cast back, rotary angles are computed and applied in fp32.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxwebrl.models.lora import LoraDense
from jaxwebrl.models.lora_config import LoraConfig

Dtype = jnp.dtype

# Names a decoder layer and a vision block give their intermediate outputs (`jax.ad_checkpoint.checkpoint_name`), so
# that a remat policy can keep them for the backward pass ([B, T, ...] text / [N, ...] patches, compute dtype):
#   query_proj, key_proj, value_proj   the text q/k/v projections (before q/k norm and rotary)
#   qkv_proj                           the vision tower's fused qkv projection
#   attention_out                      attention's output, the input of the output projection
#   out_proj                           the output projection (o_proj / proj)
#   mlpwi                              the MLP's input projections (gate and up; fc1 before the activation)
#   mlpwo                              the MLP's output projection (down / fc2): no policy lists it, since a layer's
#                                      backward never reads its own output (JAX would drop it from a saved list)
# Attention scores and probabilities are never named, so no policy keeps them: the backward recomputes them from
# the kept (or recomputed) q and k, as a flash kernel's backward does anyway.
QKV_NAMES = ("query_proj", "key_proj", "value_proj", "qkv_proj")
_save = jax.checkpoint_policies.save_only_these_names

# Rematerialisation policies by name (config `remat`), in order of least recompute (most memory) first:
# what a layer keeps from its forward pass for the backward besides its input. `parallel/cost.py` REMAT_RECOMPUTE
# holds what each one recomputes; `train/remat_fit.py` picks the first that fits a chip.
REMAT_POLICIES = {
    "none": None,                                                             # no remat: keep every intermediate
    "minimal": _save(*QKV_NAMES, "attention_out", "out_proj", "mlpwi"),       # every matmul output but the scores
    "save_dot_except_mlp": _save(*QKV_NAMES, "attention_out", "out_proj"),    # recompute the MLP's gate/up
    "save_qkv_proj": _save(*QKV_NAMES),                                       # recompute attention, o_proj, MLP
    "save_out_proj": _save("out_proj"),                                       # recompute q/k/v, attention, MLP
    "full": jax.checkpoint_policies.nothing_saveable,                        # keep only the layer's input
}


def remat_problem(name) -> str | None:
    """What is wrong with a remat policy's name (model.remat), or None: the one rule its callers share."""
    return None if name in REMAT_POLICIES else f"not a remat policy: use one of {', '.join(REMAT_POLICIES)}"


def remat_policy(name: str):
    """The jax.checkpoint policy of a `remat` name; ValueError naming the choices."""
    fix = remat_problem(name)
    if fix is not None:
        raise ValueError(f"remat={name!r} is {fix}")
    return REMAT_POLICIES[name]


def dense(features: int, *, use_bias: bool, dtype, param_dtype, name: str | None = None,
          lora: LoraConfig | None = None) -> nn.Module:
    """A Dense layer whose `kernel` is `[in, out]` (the transpose of a torch Linear weight); a `LoraDense` (the same
    kernel plus adapters) when `lora` targets `name`."""
    if lora is not None and name in lora.target_modules:
        return LoraDense(features, lora, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                         kernel_init=nn.initializers.normal(0.02), name=name)
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nn.initializers.normal(0.02),
        name=name,
    )


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)); the statistic is computed in fp32, as in the reference."""

    dim: int
    eps: float = 1e-6
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        weight = self.param("weight", nn.initializers.ones, (self.dim,), self.param_dtype)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return weight.astype(self.dtype) * normed.astype(self.dtype)


def layer_norm(dim_name: str | None = None, *, dtype, param_dtype, eps: float = 1e-6) -> nn.LayerNorm:
    """LayerNorm with the exact two-pass variance (torch's), weight/bias named scale/bias."""
    return nn.LayerNorm(
        epsilon=eps, dtype=dtype, param_dtype=param_dtype, use_fast_variance=False, name=dim_name
    )


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)); `act` is silu for every Qwen-VL MLP that uses this block."""

    hidden: int
    intermediate: int
    use_bias: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    lora: LoraConfig | None = None      # adapters on the projections it targets (models/lora.py)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kw = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype, lora=self.lora)
        gate = checkpoint_name(dense(self.intermediate, name="gate_proj", **kw)(x), "mlpwi")
        up = checkpoint_name(dense(self.intermediate, name="up_proj", **kw)(x), "mlpwi")
        return checkpoint_name(dense(self.hidden, name="down_proj", **kw)(jax.nn.silu(gate) * up), "mlpwo")


# ---------------------------------------------------------------------------------------------- rotary


def inverse_frequencies(dim: int, theta: float) -> jax.Array:
    """[dim // 2] float32: 1 / theta^(2i / dim), computed in fp32 like the reference."""
    exponent = jnp.arange(0, dim, 2, dtype=jnp.float32) / jnp.float32(dim)
    return 1.0 / (jnp.float32(theta) ** exponent)


def rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate `x [..., D]` by angles whose cos/sin broadcast to it; math in fp32, result in x.dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)


def mrope_axis_selector(mrope_section, interleaved: bool) -> np.ndarray:
    """[head_dim // 2] int: which position axis (0=T, 1=H, 2=W) drives each rotary frequency.

    Interleaved (Qwen3-VL): frequency j uses H if j % 3 == 1 and j < 3*section[1], W if j % 3 == 2 and
    j < 3*section[2], else T. Chunked (Qwen2.5-VL): the first section[0] frequencies use T, the next
    section[1] use H, the rest W.
    """
    n = int(sum(mrope_section))
    if not interleaved:
        return np.repeat(np.arange(3), np.asarray(mrope_section))
    sel = np.zeros(n, dtype=np.int32)
    for axis in (1, 2):
        idx = np.arange(axis, 3 * mrope_section[axis], 3)
        sel[idx[idx < n]] = axis
    return sel


def mrope_cos_sin(position_ids: jax.Array, head_dim: int, theta: float, selector: np.ndarray):
    """Multimodal rotary tables. position_ids [3, B, T] int -> cos, sin [B, T, head_dim] float32."""
    inv = inverse_frequencies(head_dim, theta)  # [D/2]
    freqs = position_ids.astype(jnp.float32)[..., None] * inv  # [3, B, T, D/2]
    sel = jnp.asarray(selector)
    freqs = jnp.where(sel == 0, freqs[0], jnp.where(sel == 1, freqs[1], freqs[2]))  # exact select, no matmul
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


# ------------------------------------------------------------------------------------------- attention


def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Grouped-query attention with an explicit mask.

    q [B, T, H, D], k/v [B, S, K, D] with H a multiple of K, mask [B, T, S] bool (True = may attend).
    Scores and softmax in fp32; rows with no allowed key produce a uniform (finite) average, never NaN.
    Returns [B, T, H, D] in q.dtype.
    """
    b, t, h, d = q.shape
    kv_heads = k.shape[2]
    qg = q.reshape(b, t, kv_heads, h // kv_heads, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d).astype(q.dtype)
