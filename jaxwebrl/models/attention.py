"""Attention with a factored mask, through a named kernel (`attention_kernels`): dense, in query chunks, cuDNN
flash attention on a GPU, Pallas splash attention on a TPU.

A mask is `AttentionMask(key_valid [B, S] bool, query_slot [B, T] int32 | None, prefix_causal, segment_ids)`:
query t of row b may attend key s when `key_valid[b, s]` and (no `query_slot`, or `s <= query_slot[b, t]`) and
(no `segment_ids`, or both carry the same id: packed rows). `prefix_causal` (static) says query t sits at slot t
of every row (the no-cache forward), so a chunk of queries never needs the keys after its last query: chunked
attention then skips them (about half the score FLOPs of a long causal row).

`attend(q, k, v, mask, scale, chunk, kernel)`: the no-cache causal forward runs on `kernel` ("auto" is resolved
here by `attention_kernels.select_attention_kernel` for this process's backend; a named one runs as named).
cuDNN takes each row's length, so its rows are right-padded (real tokens first, as `buffer.batching.pad_steps`
lays them out) or marked `left_padded` (the sampler's prompts: turned round for the call); splash takes padding
and packing as segment ids, anywhere in the row. A sampler's prefill into an empty cache is that causal forward
over the prompt's own keys (`decoder.TextDecoder`, `fresh_cache`). Every other mask (a prefill over a cache
already in use, decode, images of mixed sizes) runs on XLA: dense, or with chunk > 0 queries `chunk` at a
time (checkpointed) and inside a chunk the keys `chunk` at a time with an online softmax, so one [H, chunk, chunk]
block is live.
`attend_unmasked(q, k, v, scale, chunk, kernel)`: every query sees every key (a batch of same-sized images):
no mask, no padding, the same kernel choice. All give the same numbers up to fp32 rounding (fp32 scores and
softmax on XLA; cuDNN and splash accumulate in fp32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxwebrl.models.attention_kernels import KERNELS, cudnn_attention, select_attention_kernel, splash_attention
from jaxwebrl.models.layers import masked_attention


@struct.dataclass
class AttentionMask:
    """Factored attention mask (see the module docstring). A pytree: `prefix_causal` is static."""

    key_valid: jax.Array                      # [B, S] bool
    query_slot: jax.Array | None = None       # [B, T] int32, or None: no causal limit
    prefix_causal: bool = struct.field(pytree_node=False, default=False)
    segment_ids: jax.Array | None = None      # [B, T] int32 (T == S, self-attention), or None: one segment a row
    left_padded: bool = struct.field(pytree_node=False, default=False)   # real tokens last (a sampler's prompts)

    def dense(self, start: int = 0, stop: int | None = None, keys: int | None = None) -> jax.Array:
        """[B, stop - start, keys] bool: the mask of queries start..stop over the first `keys` keys."""
        valid = self.key_valid if keys is None else self.key_valid[:, :keys]
        b, s = valid.shape
        if self.query_slot is None:
            t = (stop if stop is not None else s) - start
            allowed = jnp.broadcast_to(valid[:, None, :], (b, t, s))
        else:
            slots = self.query_slot[:, start:stop]
            allowed = valid[:, None, :] & (jnp.arange(s, dtype=jnp.int32)[None, None, :] <= slots[:, :, None])
        if self.segment_ids is not None:
            allowed &= self.segment_ids[:, start:stop, None] == self.segment_ids[:, None, :s]
        return allowed


def causal_mask(attention_mask: jax.Array, segment_ids: jax.Array | None = None, *,
                left_padded: bool = False) -> AttentionMask:
    """The no-cache forward's mask: attention_mask [B, T] (True = real token) as keys, query t at slot t;
    segment_ids [B, T] int32 for packed rows (several sequences a row, each attending only to itself);
    left_padded: every row's real tokens come last (the sampler's prompts), else first (the trainer's rows)."""
    b, t = attention_mask.shape
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
    return AttentionMask(attention_mask.astype(bool), slots, prefix_causal=True, segment_ids=segment_ids,
                         left_padded=left_padded)


def _kernel(kernel: str, q: jax.Array, chunk: int) -> str:
    """"auto" resolved for this process's backend; a named kernel as it is (it may target another platform: the
    TPU AOT compile runs on a CPU host; `attention_kernels.config_kernel` checks it at start-up)."""
    if kernel == "auto":
        return select_attention_kernel(kernel, jax.default_backend(), dtype=q.dtype, chunk=chunk)
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel {kernel!r}: use one of {', '.join(KERNELS)}")
    return kernel


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask, scale: float, chunk: int = 0,
           kernel: str = "auto") -> jax.Array:
    """q [B, T, H, D], k/v [B, S, K, D] (H a multiple of K) -> [B, T, H, D] in q.dtype (see the module docstring).

    `kernel` applies to the no-cache causal forward (`mask.prefix_causal`); other masks run on XLA, `chunk`
    queries at a time when 0 < chunk < T."""
    t = q.shape[1]
    if not mask.prefix_causal:
        if chunk <= 0 or t <= chunk:
            return masked_attention(q, k, v, mask.dense(0, t), scale)
        if mask.segment_ids is not None:
            raise ValueError("segment_ids belong to the no-cache causal forward (attention.causal_mask); a cache or "
                             "segment mask marks its keys in key_valid")
        return _blocked(q, k, v, mask, scale, chunk)
    kernel = _kernel(kernel, q, chunk)
    if kernel == "cudnn":
        lengths = jnp.maximum(mask.key_valid.sum(axis=-1), 1).astype(jnp.int32)   # an all-padding row: finite
        if mask.left_padded:   # cuDNN takes right-padded rows: turn each row's padding to its end and back
            shift = (t - lengths)[:, None]                                        # [B, 1]
            to_right = lambda x, sign: jnp.take_along_axis(
                x, ((jnp.arange(t)[None, :] + sign * shift) % t)[:, :, None, None], axis=1)
            out = cudnn_attention(to_right(q, 1), to_right(k, 1), to_right(v, 1), scale, causal=True,
                                  lengths=lengths)
            return to_right(out, -1)
        return cudnn_attention(q, k, v, scale, causal=True, lengths=lengths, segment_ids=mask.segment_ids)
    if kernel == "splash":
        return splash_attention(q, k, v, scale, causal=True, key_valid=mask.key_valid, segment_ids=mask.segment_ids)
    if kernel == "xla" or t <= chunk:
        return masked_attention(q, k, v, mask.dense(0, t), scale)
    return _query_chunks(q, k, v, scale, chunk, lambda start, stop: mask.dense(start, stop, keys=stop), causal=True)


def attend_unmasked(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, chunk: int = 0,
                    kernel: str = "auto") -> jax.Array:
    """Every query attends every key of its row: q [B, T, H, D], k/v [B, T, K, D] -> [B, T, H, D] in q.dtype,
    on `kernel` (a batch of same-sized images: no mask, no padding)."""
    b, t = q.shape[:2]
    kernel = _kernel(kernel, q, chunk)
    if kernel == "cudnn":
        return cudnn_attention(q, k, v, scale, causal=False)
    if kernel == "splash":
        return splash_attention(q, k, v, scale, causal=False)
    if kernel == "xla" or t <= chunk:
        return masked_attention(q, k, v, jnp.ones((b, t, t), bool), scale)
    # keys `chunk` at a time too: a query chunk over all of an image's keys would hold [B, H, chunk, T] scores
    # for every image of the batch at once (the real-width rehearsal's tower went past 20 GiB so)
    return _blocked(q, k, v, AttentionMask(jnp.ones((b, t), bool)), scale, chunk)


def _query_chunks(q, k, v, scale: float, chunk: int, mask_of, *, causal: bool) -> jax.Array:
    """Queries `chunk` at a time (static slices, the last one shorter: no padding), each under `jax.checkpoint`
    so the backward recomputes one chunk's scores; a causal chunk sees only the keys up to its last query.
    mask_of(start, stop) -> [B, stop - start, keys] bool."""
    one = jax.checkpoint(lambda q_, k_, v_, m_: masked_attention(q_, k_, v_, m_, scale))
    t, s = q.shape[1], k.shape[1]
    outs = []
    for start in range(0, t, chunk):
        stop = min(start + chunk, t)
        keys = stop if causal else s
        outs.append(one(q[:, start:stop], k[:, :keys], v[:, :keys], mask_of(start, stop)))
    return jnp.concatenate(outs, axis=1)


def online_softmax_step(carry, scores, allowed, weighted_values, exists=None):
    """One key block of an online softmax (the chunked kernel's and the cached decode's): carry (running max
    [..., T], sum [..., T], weighted values [..., T, D]) fp32; scores [..., T, C] fp32, already scaled; `allowed`
    (broadcast to scores) False -> the fp32 minimum, so a query with no allowed key averages the values it reads
    uniformly (finite, as the dense kernel); `exists` False (padding keys) -> -inf, never read at all;
    weighted_values(probs [..., T, C]) -> [..., T, D] fp32. Returns the new carry."""
    running_max, total, acc = carry
    scores = jnp.where(allowed, scores, jnp.finfo(jnp.float32).min)
    if exists is not None:
        scores = jnp.where(exists, scores, -jnp.inf)
    new_max = jnp.maximum(running_max, scores.max(-1))
    correction = jnp.exp(running_max - new_max)
    probs = jnp.exp(scores - new_max[..., None])
    return new_max, total * correction + probs.sum(-1), acc * correction[..., None] + weighted_values(probs)


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

    @jax.checkpoint
    def one_chunk(q_chunk, slot_chunk):                      # [B, C, H, D], [B, C]
        qg = q_chunk.reshape(b, chunk, kv_heads, groups, d)

        def over_keys(carry, xs):
            k_blk, v_blk, valid_blk, first = xs
            scores = jnp.einsum("bqkgd,bskd->bkgqs", qg, k_blk, preferred_element_type=jnp.float32) * scale
            key_slot = first + jnp.arange(chunk, dtype=jnp.int32)
            allowed = valid_blk[:, None, :] & (key_slot[None, None, :] <= slot_chunk[:, :, None])     # [B, C, C]
            return online_softmax_step(
                carry, scores, allowed[:, None, None],
                lambda p: jnp.einsum("bkgqs,bskd->bkgqd", p.astype(v_blk.dtype), v_blk,
                                     preferred_element_type=jnp.float32),
                exists=(key_slot < s)[None, None, None, None, :]), None

        init = (jnp.full((b, kv_heads, groups, chunk), -jnp.inf, jnp.float32),
                jnp.zeros((b, kv_heads, groups, chunk), jnp.float32),
                jnp.zeros((b, kv_heads, groups, chunk, d), jnp.float32))
        firsts = jnp.arange(nk, dtype=jnp.int32) * chunk
        (_, l, acc), _ = jax.lax.scan(over_keys, init, (key_blocks, value_blocks, valid_blocks, firsts))
        out = acc / l[..., None]                                               # [B, K, G, C, D]
        return jnp.moveaxis(out, 3, 1).reshape(b, chunk, h, d).astype(q.dtype)

    out = jax.lax.map(lambda xs: one_chunk(*xs), (q_chunks, slot_chunks))     # [nq, B, C, H, D]
    return jnp.moveaxis(out, 0, 1).reshape(b, nq * chunk, h, d)[:, :t]
