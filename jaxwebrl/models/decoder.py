"""The Qwen-VL text decoder (shared by Qwen3-VL and Qwen2.5-VL): GQA + M-RoPE + SwiGLU, with a KV cache.

Qwen3-VL: q/k RMSNorm per head, interleaved M-RoPE, no qkv bias. Qwen2.5-VL: qkv bias, chunked M-RoPE.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxwebrl.models import decode_attention, kv_cache
from jaxwebrl.models.config import TextConfig
from jaxwebrl.models.lora_config import LoraConfig
from jaxwebrl.models.attention import AttentionMask, attend, causal_mask
from jaxwebrl.models.layers import (RMSNorm, SwiGLU, apply_rotary, dense, mrope_axis_selector, mrope_cos_sin,
                                    remat_policy)
from jaxwebrl.parallel import partition
from jaxwebrl.parallel.mesh import constrain_batch


def scatter_image_features(image_slots: jax.Array, features: jax.Array, base: jax.Array | None) -> jax.Array:
    """Place rows of features [N, E] on the image-token positions: image_slots [B, T] int32 holds the feature row
    of every image token (-1 elsewhere, `vl_model.image_slots`).

    Other positions keep `base` [B, T, E] (or zeros when base is None).
    """
    picked = features[jnp.clip(image_slots, 0, features.shape[0] - 1)]
    if base is None:
        base = jnp.zeros_like(picked)
    return jnp.where((image_slots >= 0)[..., None], picked.astype(base.dtype), base)


class TextAttention(nn.Module):
    config: TextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_chunk: int = 0
    attention_impl: str = "xla"
    lora: LoraConfig | None = None

    @nn.compact
    def __call__(self, x, cos, sin, mask: AttentionMask, layer_cache=None, cache_index=None):
        """x [B, T, E]; cos/sin [B, T, D] f32; mask over [B, T] queries and [B, S] keys; layer_cache
        {"k","v": [B, K, S, D], "read": kv_cache.DecodeRead} (`models/kv_cache.py`).

        Returns (out [B, T, E], new layer_cache or None).
        """
        c = self.config
        b, t, _ = x.shape
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        kw_lora = dict(kw, lora=self.lora)
        q = dense(c.num_heads * c.head_dim, use_bias=c.attention_bias, name="q_proj", **kw_lora)(x)
        k = dense(c.num_kv_heads * c.head_dim, use_bias=c.attention_bias, name="k_proj", **kw_lora)(x)
        v = dense(c.num_kv_heads * c.head_dim, use_bias=c.attention_bias, name="v_proj", **kw_lora)(x)
        q, k, v = (checkpoint_name(q, "query_proj"), checkpoint_name(k, "key_proj"),
                   checkpoint_name(v, "value_proj"))      # names a remat policy keeps (`layers.REMAT_POLICIES`)
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
            new_cache = kv_cache.write_layer(layer_cache, k, v, cache_index)
        if new_cache is not None and t == 1:   # a decode step reads the cache in its own layout
            out = decode_attention.attend_cache(q, new_cache, mask, c.head_dim**-0.5, layer_cache["read"])
        else:
            if new_cache is not None and not mask.prefix_causal:   # a prefill over a cache in use: every slot
                k, v = kv_cache.keys_values(new_cache)
            out = attend(q, k.astype(self.dtype), v.astype(self.dtype), mask, c.head_dim**-0.5, self.attention_chunk,
                         self.attention_impl)
        out = checkpoint_name(out, "attention_out")
        out = dense(x.shape[-1], use_bias=False, name="o_proj", **kw_lora)(out.reshape(b, t, -1))
        return checkpoint_name(out, "out_proj"), new_cache


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer. `deepstack` = (features [n, N', E], image_slots [B, T]) with a traced
    `layer_index` (the scanned decoder): features[layer_index] are added after the layer when layer_index < n."""

    config: TextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_chunk: int = 0
    attention_impl: str = "xla"
    lora: LoraConfig | None = None

    @nn.compact
    def __call__(self, x, cos, sin, mask, layer_cache=None, cache_index=None, deepstack=None, layer_index=None):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x = constrain_batch(x)          # rows [B, T, E] stay split over the batch axes (`parallel.mesh`)
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, name="input_layernorm", **kw)(x)
        h, new_cache = TextAttention(c, name="self_attn", attention_chunk=self.attention_chunk,
                                     attention_impl=self.attention_impl, lora=self.lora, **kw)(
            h, cos, sin, mask, layer_cache, cache_index)
        x = x + h
        h = RMSNorm(c.hidden_size, c.rms_norm_eps, name="post_attention_layernorm", **kw)(x)
        x = x + SwiGLU(c.hidden_size, c.intermediate_size, name="mlp", lora=self.lora, **kw)(h)
        if deepstack is not None:
            features, image_slots = deepstack
            n = features.shape[0]
            x = jax.lax.cond(
                layer_index < n,
                lambda x_: x_ + scatter_image_features(image_slots, features[jnp.minimum(layer_index, n - 1)], None
                                                       ).astype(x_.dtype),
                lambda x_: x_, x)
        return x, new_cache


class TextDecoder(nn.Module):
    """Token embedding + decoder layers + final norm. DeepStack features are added after the first layers.

    `scan_layers`: the layers are one `nn.scan` over stacked params (`layers/...` leaves are [L, ...]): one layer
    is compiled instead of L. The scanned decoder has no KV-cache path (the sampler runs an unstacked copy,
    `stacking.unstack`). `remat` names the rematerialisation policy of every layer (`layers.REMAT_POLICIES`).
    """

    config: TextConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    remat: str = "none"
    scan_layers: bool = False
    attention_chunk: int = 0
    attention_impl: str = "xla"
    lora: LoraConfig | None = None      # adapters on the layers' targeted projections (models/lora.py)

    def setup(self):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, attention_chunk=self.attention_chunk,
                  attention_impl=self.attention_impl, lora=self.lora)
        self.embed_tokens = nn.Embed(
            c.vocab_size, c.hidden_size, embedding_init=nn.initializers.normal(0.02),
            dtype=self.dtype, param_dtype=self.param_dtype,
        )
        policy = remat_policy(self.remat)
        layer_cls = DecoderLayer
        if self.remat != "none":
            layer_cls = nn.remat(DecoderLayer, policy=policy, prevent_cse=not self.scan_layers)
        if self.scan_layers:
            broadcast = (nn.broadcast,) * 6   # cos, sin, mask, layer_cache, cache_index, deepstack
            self.layers = nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
                                  in_axes=broadcast + (0,), length=c.num_layers)(c, name="layers", **kw)
        else:
            self.layers = [layer_cls(c, name=f"layers_{i}", **kw) for i in range(c.num_layers)]
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype)
        self.selector = mrope_axis_selector(c.mrope_section, c.mrope_interleaved)

    def embed(self, input_ids: jax.Array) -> jax.Array:
        """input_ids [B, T] int -> [B, T, E] in the compute dtype (`nn.Embed`'s lookup, on a mesh from the table
        gathered over `fsdp`: `partition.lookup_table`)."""
        table = partition.lookup_table(jnp.asarray(self.embed_tokens.embedding, self.dtype))
        return jnp.take(table, input_ids, axis=0)

    def __call__(
        self,
        inputs_embeds: jax.Array,
        position_ids: jax.Array,
        attention_mask: jax.Array,
        cache: dict | None = None,
        deepstack: Sequence[jax.Array] = (),
        image_slots: jax.Array | None = None,
        fresh_cache: bool = False,
    ):
        """inputs_embeds [B, T, E]; position_ids [3, B, T] int32; attention_mask [B, T] bool;
        deepstack: per early layer, merged image features [N', E], added after that layer on the positions
        `image_slots [B, T]` gives (the feature row of every image token, -1 elsewhere).
        fresh_cache (static): `cache` is empty (`kv_cache.init_cache`) and this call's left-padded prompts fill it
        from slot 0, so the prompt attends its own keys causally, on the model's attention kernel, instead of
        every slot of the cache on XLA (the same numbers: the slots past the prompt are empty).

        Returns (hidden [B, T, E] after the final norm, new cache or None).
        """
        c = self.config
        t = inputs_embeds.shape[1]
        cos, sin = mrope_cos_sin(position_ids, c.head_dim, c.rope_theta, self.selector)
        if cache is None:
            mask, valid, index = causal_mask(attention_mask), None, None
        else:
            if self.scan_layers:
                raise ValueError("the scanned decoder (scan_layers=True) has no KV-cache path: decode with an "
                                 "unstacked copy (models/stacking.unstack and scan_layers=False), as the Sampler does")
            valid, slots = kv_cache.cached_query_slots(cache, attention_mask)
            mask = causal_mask(attention_mask, left_padded=True) if fresh_cache else AttentionMask(valid, slots)
            index = cache["index"]
        x = inputs_embeds
        if self.scan_layers:
            stacked = (jnp.stack(list(deepstack)), image_slots) if deepstack else None
            x, _ = self.layers(x, cos, sin, mask, None, None, stacked, jnp.arange(c.num_layers))
            return self.norm(x), None
        new_layers = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else dict(cache["layers"][i], read=cache["read"])
            x, new_layer_cache = layer(x, cos, sin, mask, layer_cache, index)
            new_layers.append(new_layer_cache)
            if i < len(deepstack):
                x = x + scatter_image_features(image_slots, deepstack[i], None).astype(x.dtype)
        x = self.norm(x)
        if cache is None:
            return x, None
        last = jnp.max(jnp.where(attention_mask[None], position_ids, -1), axis=(0, 2)) + 1  # [B]
        new_cache = {
            "layers": new_layers,
            "index": cache["index"] + t,
            "valid": valid,
            "next_position": jnp.maximum(cache["next_position"], last).astype(jnp.int32),
            "read": cache["read"],
        }
        return x, new_cache
