"""Attention with a factored mask, dense or in query chunks (memory O(chunk × keys) instead of O(queries × keys)).

A mask is `AttentionMask(key_valid [B, S] bool, query_slot [B, T] int32 | None, prefix_causal)`: query t of row b
may attend key s when `key_valid[b, s]` and (no `query_slot`, or `s <= query_slot[b, t]`). `prefix_causal` (static)
says query t sits at slot t of every row (the no-cache forward), so a chunk of queries never needs the keys after
its last query: chunked attention then skips them (about half the score FLOPs of a long causal row).

`attend(q, k, v, mask, scale, chunk)`: chunk = 0 (or T ≤ chunk) builds the [B, T, S] mask and runs the dense
kernel exactly as before; otherwise queries go `chunk` at a time, each chunk under `jax.checkpoint`, so the
backward pass recomputes one chunk's scores instead of keeping every chunk's [H, chunk, S] probabilities.
Both give the same numbers (fp32 scores and softmax per query row).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxwebrl.models.layers import masked_attention


@struct.dataclass
class AttentionMask:
    """Factored attention mask (see the module docstring). A pytree: `prefix_causal` is static."""

    key_valid: jax.Array                      # [B, S] bool
    query_slot: jax.Array | None = None       # [B, T] int32, or None: no causal limit
    prefix_causal: bool = struct.field(pytree_node=False, default=False)

    def dense(self, start: int = 0, stop: int | None = None, keys: int | None = None) -> jax.Array:
        """[B, stop - start, keys] bool: the mask of queries start..stop over the first `keys` keys."""
        valid = self.key_valid if keys is None else self.key_valid[:, :keys]
        b, s = valid.shape
        if self.query_slot is None:
            t = (stop if stop is not None else s) - start
            return jnp.broadcast_to(valid[:, None, :], (b, t, s))
        slots = self.query_slot[:, start:stop]
        causal = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= slots[:, :, None]
        return valid[:, None, :] & causal


def causal_mask(attention_mask: jax.Array) -> AttentionMask:
    """The no-cache forward's mask: attention_mask [B, T] (True = real token) as keys, query t at slot t."""
    b, t = attention_mask.shape
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
    return AttentionMask(attention_mask.astype(bool), slots, prefix_causal=True)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, scale: float, chunk: int = 0) -> jax.Array:
    """q [B, T, H, D], k/v [B, S, K, D] (H a multiple of K) -> [B, T, H, D] in q.dtype (see the module docstring)."""
    t = q.shape[1]
    if chunk <= 0 or t <= chunk:
        return masked_attention(q, k, v, mask.dense(0, t), scale)
    one = jax.checkpoint(lambda q_, k_, v_, m_: masked_attention(q_, k_, v_, m_, scale))
    if mask.prefix_causal:  # static shapes per chunk: each chunk sees only the keys up to its last query
        outs = []
        for start in range(0, t, chunk):
            stop = min(start + chunk, t)
            outs.append(one(q[:, start:stop], k[:, :stop], v[:, :stop], mask.dense(start, stop, keys=stop)))
        return jnp.concatenate(outs, axis=1)
    pad = -t % chunk
    n = (t + pad) // chunk
    b = q.shape[0]
    q_chunks = jnp.moveaxis(jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, n, chunk, *q.shape[2:]), 1, 0)
    if mask.query_slot is None:
        def body(q_):
            return one(q_, k, v, AttentionMask(mask.key_valid).dense(0, chunk))
        out = jax.lax.map(body, q_chunks)                                                 # [n, B, C, H, D]
    else:
        slots = jnp.pad(mask.query_slot, ((0, 0), (0, pad)), constant_values=-1)        # padded queries: no key
        slot_chunks = jnp.moveaxis(slots.reshape(b, n, chunk), 1, 0)                     # [n, B, C]
        out = jax.lax.map(lambda xs: one(xs[0], k, v, AttentionMask(mask.key_valid, xs[1]).dense()), (q_chunks, slot_chunks))
    return jnp.moveaxis(out, 0, 1).reshape(b, n * chunk, *q.shape[2:])[:, :t]
