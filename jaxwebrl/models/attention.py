"""Attention with a factored mask, dense or in query chunks (memory O(chunk × keys) instead of O(queries × keys)).

A mask is `AttentionMask(key_valid [B, S] bool, query_slot [B, T] int32 | None, prefix_causal)`: query t of row b
may attend key s when `key_valid[b, s]` and (no `query_slot`, or `s <= query_slot[b, t]`). `prefix_causal` (static)
says query t sits at slot t of every row (the no-cache forward), so a chunk of queries never needs the keys after
its last query: chunked attention then skips them (about half the score FLOPs of a long causal row).

`attend(q, k, v, mask, scale, chunk)`: chunk = 0 (or T ≤ chunk) builds the [B, T, S] mask and runs the dense
kernel exactly as before; otherwise queries go `chunk` at a time, each chunk under `jax.checkpoint`, so the
backward pass recomputes one chunk's scores instead of keeping every chunk's [H, chunk, S] probabilities. The
causal no-cache row keeps [H, chunk, keys so far] per chunk; every other mask (the KV-cache prefill over a long
cache, the vision tower's images) also walks the keys `chunk` at a time with an online softmax, so one
[H, chunk, chunk] block is live. All give the same numbers up to fp32 rounding (fp32 scores and softmax).
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


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, scale: float, chunk: int = 0,
           impl: str = "xla") -> jax.Array:
    """q [B, T, H, D], k/v [B, S, K, D] (H a multiple of K) -> [B, T, H, D] in q.dtype (see the module docstring).

    impl="fused" on the no-cache causal forward (`mask.prefix_causal`) calls `jax.nn.dot_product_attention`
    (JAX picks the kernel: cuDNN flash attention on a GPU, XLA elsewhere) with a causal mask and each row's
    valid length, which is exact for right-padded rows (real tokens first, as `buffer.batching.pad_steps` lays
    them out): a real query never sees a key after it. Other masks (KV-cache prefill, vision) use the XLA path.
    """
    t = q.shape[1]
    if impl == "fused" and mask.prefix_causal:
        lengths = mask.key_valid.sum(axis=-1).astype(jnp.int32)
        out = jax.nn.dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), scale=scale, is_causal=True,
                                           query_seq_lengths=lengths, key_value_seq_lengths=lengths)
        return out.astype(q.dtype)
    if chunk <= 0 or t <= chunk:
        return masked_attention(q, k, v, mask.dense(0, t), scale)
    one = jax.checkpoint(lambda q_, k_, v_, m_: masked_attention(q_, k_, v_, m_, scale))
    if mask.prefix_causal:  # static shapes per chunk: each chunk sees only the keys up to its last query
        outs = []
        for start in range(0, t, chunk):
            stop = min(start + chunk, t)
            outs.append(one(q[:, start:stop], k[:, :stop], v[:, :stop], mask.dense(start, stop, keys=stop)))
        return jnp.concatenate(outs, axis=1)
    return _blocked(q, k, v, mask, scale, chunk)


def _blocked(q, k, v, mask: AttentionMask, scale: float, chunk: int) -> jax.Array:
    """Queries `chunk` at a time (each chunk checkpointed), and inside a chunk the keys `chunk` at a time with an
    online softmax (running max and sum): one [B, H, chunk, chunk] score block is live, whatever the key count.
    A query with no allowed key averages every value uniformly, as the dense kernel does."""
    b, t, h, d = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    groups = h // kv_heads
    pad_q, pad_k = -t % chunk, -s % chunk
    nq, nk = (t + pad_q) // chunk, (s + pad_k) // chunk
    q_chunks = jnp.moveaxis(jnp.pad(q, ((0, 0), (0, pad_q), (0, 0), (0, 0))).reshape(b, nq, chunk, h, d), 1, 0)
    slots = mask.query_slot if mask.query_slot is not None else jnp.full((b, t), s, jnp.int32)
    slot_chunks = jnp.moveaxis(jnp.pad(slots, ((0, 0), (0, pad_q)), constant_values=-1).reshape(b, nq, chunk), 1, 0)
    key_blocks = jnp.moveaxis(jnp.pad(k, ((0, 0), (0, pad_k), (0, 0), (0, 0))).reshape(b, nk, chunk, kv_heads, d), 1, 0)
    value_blocks = jnp.moveaxis(jnp.pad(v, ((0, 0), (0, pad_k), (0, 0), (0, 0))).reshape(b, nk, chunk, kv_heads, d),
                                1, 0)
    valid_blocks = jnp.moveaxis(jnp.pad(mask.key_valid, ((0, 0), (0, pad_k))).reshape(b, nk, chunk), 1, 0)
    minimum = jnp.finfo(jnp.float32).min

    @jax.checkpoint
    def one_chunk(q_chunk, slot_chunk):                      # [B, C, H, D], [B, C]
        qg = q_chunk.reshape(b, chunk, kv_heads, groups, d)

        def over_keys(carry, xs):
            m, l, acc = carry
            k_blk, v_blk, valid_blk, first = xs
            scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k_blk, preferred_element_type=jnp.float32) * scale
            key_slot = first + jnp.arange(chunk, dtype=jnp.int32)
            allowed = valid_blk[:, None, :] & (key_slot[None, None, :] <= slot_chunk[:, :, None])     # [B, C, C]
            scores = jnp.where(allowed[:, None, None], scores, minimum)
            scores = jnp.where((key_slot < s)[None, None, None, None, :], scores, -jnp.inf)   # padding: never
            m_new = jnp.maximum(m, scores.max(-1))
            correction = jnp.exp(m - m_new)
            p = jnp.exp(scores - m_new[..., None])
            l = l * correction + p.sum(-1)
            acc = acc * correction[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v_blk.dtype), v_blk,
                                                           preferred_element_type=jnp.float32)
            return (m_new, l, acc), None

        init = (jnp.full((b, kv_heads, groups, chunk), -jnp.inf, jnp.float32),
                jnp.zeros((b, kv_heads, groups, chunk), jnp.float32),
                jnp.zeros((b, kv_heads, groups, chunk, d), jnp.float32))
        firsts = jnp.arange(nk, dtype=jnp.int32) * chunk
        (_, l, acc), _ = jax.lax.scan(over_keys, init, (key_blocks, value_blocks, valid_blocks, firsts))
        out = acc / l[..., None]                                               # [B, K, G, C, D]
        return jnp.moveaxis(out, 3, 1).reshape(b, chunk, h, d).astype(q.dtype)

    out = jax.lax.map(lambda xs: one_chunk(*xs), (q_chunks, slot_chunks))     # [nq, B, C, H, D]
    return jnp.moveaxis(out, 0, 1).reshape(b, nq * chunk, h, d)[:, :t]
