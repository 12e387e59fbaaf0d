"""A decode step's attention, read from the KV cache in the cache's own layout (`models/kv_cache.py`).

q [B, T, H, D] (T = 1 for a decode step) attends the layer's keys/values [B, K, S, D] under the call's
`AttentionMask` (key_valid [B, S], query_slot [B, T]); query head h reads kv head h // G (G = H / K), as in
`layers.masked_attention`. Two reads, picked by the cache's static `kv_cache.DecodeRead`:

- dense (block 0): every slot in one pass, filled or not: scores [B, K, G, T, S].
- ragged (block > 0): the slots from 0 to the batch's furthest query slot (the last filled one), `block` at a
  time in a `lax.fori_loop` whose trip count is computed on the device, with an online softmax (running max,
  sum and weighted values). Early in a long cache most slots are not read. A block that would run past S is
  moved back to end at S, and its slots an earlier block covered are masked out.

Both contract the cache with (row, kv head) as batch dimensions, over d for the scores and over s for the values:
the cache's axis order is already the dot's, so XLA inserts no relayout of the cache (the compiled HLO is checked
in tests/models/test_decode_attention.py). Scores, softmax and accumulation are fp32. A query with no allowed key
averages the values it read uniformly (finite, never NaN); a decode step's own new key is always allowed, so the
two reads agree to fp32 rounding.

Which read pays is measured, not assumed (`bench/device_check.py decode`: both side by side), so dense is the
default (`rollout.decode_block = 0`). The ragged read costs more per slot it reads: XLA materialises each block's
dynamic slice of the cache before the dot (a copy fusion a block, in the CPU's compiled HLO and in a TPU v5e AOT
compile alike; the dense read feeds the cache itself to the dot), and a loop whose trip count is known only on the
device is a while loop, whose condition XLA:GPU reads back on the host every iteration. It can pay where most of
the cache is empty (a long response budget, early in the response).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwebrl.models.attention import AttentionMask, online_softmax_step
from jaxwebrl.models.kv_cache import DecodeRead


def attend_cache(q: jax.Array, layer_cache: dict, mask: AttentionMask, scale: float, read: DecodeRead) -> jax.Array:
    """q [B, T, H, D], layer_cache {"k", "v": [B, K, S, D]} (this call's keys already written), mask with a
    query_slot -> [B, T, H, D] in q.dtype (see the module docstring)."""
    b, t, h, d = q.shape
    keys, values = layer_cache["k"], layer_cache["v"]
    kv_heads, s = keys.shape[1], keys.shape[2]
    queries = jnp.transpose(q.reshape(b, t, kv_heads, h // kv_heads, d), (0, 2, 3, 1, 4))   # [B, K, G, T, D]
    carry = (jnp.full((b, kv_heads, h // kv_heads, t), -jnp.inf, jnp.float32),
             jnp.zeros((b, kv_heads, h // kv_heads, t), jnp.float32),
             jnp.zeros((b, kv_heads, h // kv_heads, t, d), jnp.float32))
    if read.block == 0 or read.block >= s:
        _, total, acc = _accumulate(carry, queries, keys, values, mask.dense(0, t), scale)
    else:
        _, total, acc = _ragged(carry, queries, keys, values, mask, scale, read.block)
    out = acc / total[..., None]                                                          # [B, K, G, T, D]
    return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, t, h, d).astype(q.dtype)


def _ragged(carry, queries, keys, values, mask: AttentionMask, scale: float, block: int):
    """The online softmax over key blocks [0, block), [block, 2 block), ... up to the furthest query slot."""
    s = keys.shape[2]
    slots = mask.query_slot                                                               # [B, T]
    blocks = (jnp.minimum(jnp.max(slots) + 1, s) + block - 1) // block

    def one_block(j, carry):
        first = j * block
        start = jnp.minimum(first, s - block)                  # the last block ends at S
        key_slot = start + jnp.arange(block, dtype=jnp.int32)
        valid = jax.lax.dynamic_slice_in_dim(mask.key_valid, start, block, axis=1)       # [B, C]
        allowed = valid[:, None, :] & (key_slot[None, None, :] <= slots[:, :, None]) & (key_slot >= first)
        return _accumulate(carry, queries, jax.lax.dynamic_slice_in_dim(keys, start, block, axis=2),
                           jax.lax.dynamic_slice_in_dim(values, start, block, axis=2), allowed, scale)

    return jax.lax.fori_loop(0, blocks, one_block, carry)


def _accumulate(carry, queries, keys, values, allowed, scale: float):
    """One block of the online softmax (`attention.online_softmax_step`). carry (max [B, K, G, T], sum
    [B, K, G, T], acc [B, K, G, T, D]) fp32; queries [B, K, G, T, D]; keys/values [B, K, C, D]; allowed [B, T, C]."""
    scores = jnp.einsum("bkgtd,bkcd->bkgtc", queries, keys, preferred_element_type=jnp.float32) * scale
    return online_softmax_step(carry, scores, allowed[:, None, None],
                               lambda probs: jnp.einsum("bkgtc,bkcd->bkgtd", probs.astype(values.dtype), values,
                                                        preferred_element_type=jnp.float32))
