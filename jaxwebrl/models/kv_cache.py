"""KV cache for the text decoder (a plain pytree of arrays, so it jits, donates and shards like params).

Layout, for a decoder with L layers, K kv heads of size D, batch B and capacity S:

    cache = {
        "layers": [{"k": [B, S, K, D], "v": [B, S, K, D]}] * L,   # keys are stored after rotary
        "index": [B] int32,          # next slot to write, per row
        "valid": [B, S] bool,        # slot holds a real (non-padding) key
        "next_position": [B] int32,  # M-RoPE position of the next text token (max position so far + 1)
    }

A forward call with `cache=` writes its T new keys at slots index..index+T-1 (their validity is the call's
attention_mask), then every query attends to all valid slots at or before its own slot. Left-padded prompts
are therefore exact: padding slots are never attended. Decoding more than S tokens in total is an error of the
caller (slots past S are not written); size S = prompt length + max new tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init_cache(config, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """An empty cache for `config` (a ModelConfig or TextConfig): nothing valid, index 0."""
    text = getattr(config, "text", config)
    shape = (batch, max_len, text.num_kv_heads, text.head_dim)
    return {
        "layers": [
            {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)} for _ in range(text.num_layers)
        ],
        "index": jnp.zeros((batch,), jnp.int32),
        "valid": jnp.zeros((batch, max_len), bool),
        "next_position": jnp.zeros((batch,), jnp.int32),
    }


def write_rows(buffer: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
    """Write new [B, T, ...] into buffer [B, S, ...] at per-row slot index [B]."""

    def one(buf, upd, i):
        start = (i,) + (0,) * (buf.ndim - 1)
        return jax.lax.dynamic_update_slice(buf, upd.astype(buf.dtype), start)

    return jax.vmap(one)(buffer, new, index)


def cached_query_slots(cache: dict, attention_mask: jax.Array):
    """Validity after writing this call's tokens and the slot of each query (it attends valid slots ≤ its own).

    attention_mask [B, T] bool (True = real token). Returns (valid [B, S] bool, query_slot [B, T] int32).
    """
    t = attention_mask.shape[1]
    valid = write_rows(cache["valid"], attention_mask, cache["index"])
    return valid, cache["index"][:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
