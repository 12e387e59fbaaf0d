"""The Qwen-VL text decoder (shared by Qwen3-VL and Qwen2.5-VL): GQA + M-RoPE + SwiGLU, with a KV cache.

Qwen3-VL: q/k RMSNorm per head, interleaved M-RoPE, no qkv bias. Qwen2.5-VL: qkv bias, chunked M-RoPE.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxwebrl.models import kv_cache
from jaxwebrl.models.config import TextConfig
from jaxwebrl.models.layers import RMSNorm, SwiGLU, apply_rotary, dense, masked_attention, mrope_axis_selector, mrope_cos_sin


class TextAttention(nn.Module):
    config: TextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin, mask, layer_cache=None, cache_index=None):
        """x [B, T, E]; cos/sin [B, T, D] f32; mask [B, T, S] bool; layer_cache {"k","v": [B, S, K, D]}.

        Returns (out [B, T, E], new layer_cache or None).
        """
        c = self.config
        b, t, _ = x.shape
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        q = dense(c.num_heads * c.head_dim, use_bias=c.attention_bias, name="q_proj", **kw)(x)
        k = dense(c.num_kv_heads * c.head_dim, use_bias=c.attention_bias, name="k_proj", **kw)(x)
        v = dense(c.num_kv_heads * c.head_dim, use_bias=c.attention_bias, name="v_proj", **kw)(x)
        q = q.reshape(b, t, c.num_heads, c.head_dim)
        k = k.reshape(b, t, c.num_kv_heads, c.head_dim)
        v = v.reshape(b, t, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q = RMSNorm(c.head_dim, c.rms_norm_eps, name="q_norm", **kw)(q)
            k = RMSNorm(c.head_dim, c.rms_norm_eps, name="k_norm", **kw)(k)
        q = apply_rotary(q, cos[:, :, None, :], sin[:, :, None, :])
        k = apply_rotary(k, cos[:, :, None, :], sin[:, :, None, :])
        new_cache = None
        if layer_cache is not None:
            k = kv_cache.write_rows(layer_cache["k"], k, cache_index)
            v = kv_cache.write_rows(layer_cache["v"], v, cache_index)
            new_cache = {"k": k, "v": v}
        out = masked_attention(q, k.astype(self.dtype), v.astype(self.dtype), mask, c.head_dim**-0.5)
        out = dense(x.shape[-1], use_bias=False, name="o_proj", **kw)(out.reshape(b, t, -1))
        return out, new_cache


class DecoderLayer(nn.Module):
    config: TextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin, mask, layer_cache=None, cache_index=None):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, name="input_layernorm", **kw)(x)
        h, new_cache = TextAttention(c, name="self_attn", **kw)(h, cos, sin, mask, layer_cache, cache_index)
        x = x + h
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, name="post_attention_layernorm", **kw)(x)
        x = x + SwiGLU(c.hidden_size, c.intermediate_size, name="mlp", **kw)(h)
        return x, new_cache


class TextDecoder(nn.Module):
    """Token embedding + decoder layers + final norm. DeepStack features are added after the first layers."""

    config: TextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    remat: bool = False

    def setup(self):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, embedding_init=nn.initializers.normal(0.02), **kw
        )
        layer_cls = nn.remat(DecoderLayer, static_argnums=()) if self.remat else DecoderLayer
        self.layers = [layer_cls(c, name=f"layers_{i}", **kw) for i in range(c.num_layers)]
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, **kw)
        self.selector = mrope_axis_selector(c.mrope_section, c.mrope_interleaved)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        """input_ids [B, T] int -> [B, T, E] in the compute dtype."""
        return self.embed_tokens(input_ids)

    def attend(self, hidden: jax.Array) -> jax.Array:
        """Tied head: hidden [B, T, E] -> logits [B, T, V] float32."""
        table = self.embed_tokens.embedding.astype(jnp.float32)
        return jnp.einsum("bte,ve->btv", hidden.astype(jnp.float32), table)

    def __call__(
        self,
        inputs_embeds: jax.Array,
        position_ids: jax.Array,
        attention_mask: jax.Array,
        cache: dict | None = None,
        deepstack: Sequence[jax.Array] = (),
    ):
        """inputs_embeds [B, T, E]; position_ids [3, B, T] int32; attention_mask [B, T] bool;
        deepstack: per early layer, [B, T, E] features (zero outside visual tokens) added after that layer.

        Returns (hidden [B, T, E] after the final norm, new cache or None).
        """
        c = self.config
        t = inputs_embeds.shape[1]
        cos, sin = mrope_cos_sin(position_ids, c.head_dim, c.rope_theta, self.selector)
        if cache is None:
            causal = jnp.tril(jnp.ones((t, t), bool))
            mask = attention_mask[:, None, :] & causal[None]
            valid, index = None, None
        else:
            valid, mask = kv_cache.cached_attention_mask(cache, attention_mask)
            index = cache["index"]
        x = inputs_embeds
        new_layers = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache["layers"][i]
            x, new_layer_cache = layer(x, cos, sin, mask, layer_cache, index)
            new_layers.append(new_layer_cache)
            if i < len(deepstack):
                x = x + deepstack[i].astype(x.dtype)
        x = self.norm(x)
        if cache is None:
            return x, None
        last = jnp.max(jnp.where(attention_mask[None], position_ids, -1), axis=(0, 2)) + 1  # [B]
        new_cache = {
            "layers": new_layers,
            "index": cache["index"] + t,
            "valid": valid,
            "next_position": jnp.maximum(cache["next_position"], last).astype(jnp.int32),
        }
        return x, new_cache
