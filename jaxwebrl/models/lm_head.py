"""The LM head and per-token log-probs without the full [B, T, V] logits.

At paper scale (151,936-token vocabulary, 16,384-token rows) full-vocabulary fp32 logits and their log-softmax
are ~10 GB per row; the log-prob of the sampled token needs none of that at once. `token_logprobs` computes it
from the decoder's hidden states:

- on the positions that carry loss only, gathered into a static bucket (`positions [B, K]`), or on every
  position when no bucket is given;
- with the head weight as [V, E] (the tied embedding table, or the untied head in HF's own layout), so a
  vocabulary chunk is a contiguous block of rows;
- over the vocabulary `chunk` entries at a time with a fused, online log-sum-exp (running max, rescaled sum,
  the target's logit picked on the way), under a custom VJP whose backward pass walks the same vocabulary chunks:
  it recomputes each chunk's logits, writes that chunk's slice of the head-weight gradient directly and
  accumulates the small [N, E] hidden-state gradient. Nothing of size [N, V] or a second [E, V] accumulator is
  ever live: the temporaries are one [N, chunk] block;
- with the per-token entropy of the same (restricted, tempered) distribution as a stat (no gradient).

The numbers are those of `log_softmax(where(allowed, logits / temperature, min))[target]` on the full logits.
The head runs in fp32 when the model computes in fp32 (the tiny default), otherwise in the compute dtype with
fp32 accumulation (bf16 hidden states times the head; the same products the fp32 cast of bf16 values gives).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.models.sampling_transform import LOGPROB_FLOOR, NEG_INF as _MIN, sampling_logits, truncates


def head_weight(params, tied: bool) -> jax.Array:
    """The head weight [V, E]: the tied embedding table or the untied head (`lm_head/weight`, HF's layout)."""
    if tied:
        return params["language_model"]["embed_tokens"]["embedding"]
    return params["lm_head"]["weight"]


def _matmul_dtype(compute_dtype):
    return jnp.float32 if jnp.dtype(compute_dtype) == jnp.float32 else jnp.dtype(compute_dtype)


def head_logits(hidden: jax.Array, weight: jax.Array, compute_dtype) -> jax.Array:
    """hidden [..., E], weight [V, E] -> logits [..., V] float32 (see the module docstring for the precision)."""
    dtype = _matmul_dtype(compute_dtype)
    return jnp.einsum("...e,ve->...v", hidden.astype(dtype), weight.astype(dtype), preferred_element_type=jnp.float32)


def vocab_chunk(vocab: int, want: int) -> int:
    """The largest divisor of `vocab` that is at most `want` (want <= 0: the whole vocabulary)."""
    if want <= 0 or want >= vocab:
        return vocab
    return max(d for d in range(1, want + 1) if vocab % d == 0)


def _weight_rows(weight, start, size, dtype):
    """Rows start..start+size of the head weight [size, E] in the matmul dtype: one chunk's copy, never a [V, E]
    one. XLA's bf16 propagation would turn `astype(bfloat16)` of a slice of an fp32 weight into a cast of the
    whole weight before the vocabulary loop (an optimization barrier does not stop it), so fp32 -> bf16 goes
    through the bits (`to_bfloat16`), which it cannot move."""
    rows = jax.lax.dynamic_slice_in_dim(weight, start, size, axis=0)
    if rows.dtype == jnp.float32 and jnp.dtype(dtype) == jnp.bfloat16:
        return to_bfloat16(rows)
    return rows.astype(dtype)


def to_bfloat16(x: jax.Array) -> jax.Array:
    """float32 -> bfloat16 rounded to nearest even, like `astype`, computed on the bits (see `_weight_rows`)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    half = jax.lax.bitcast_convert_type(rounded.astype(jnp.uint16), jnp.bfloat16)
    return jnp.where(jnp.isnan(x), jnp.array(jnp.nan, jnp.bfloat16), half)


def _chunk_logits(hidden, weight, start, size, compute_dtype, temperature, states, table):
    """Logits of vocabulary entries start..start+size: [N, size] f32, tempered, disallowed entries at min."""
    dtype = _matmul_dtype(compute_dtype)
    logits = jnp.einsum("ne,ve->nv", hidden.astype(dtype), _weight_rows(weight, start, size, dtype),
                        preferred_element_type=jnp.float32) / temperature
    if states is None:
        return logits, None
    rows = jax.lax.dynamic_slice_in_dim(table, start, size, axis=1)[jnp.maximum(states, 0)]    # [N, size]
    allowed = jnp.where(states[:, None] >= 0, rows, True)
    return jnp.where(allowed, logits, _MIN), allowed


def _forward(hidden, weight, targets, states, table, compute_dtype, temperature, chunk):
    """(picked logprob, entropy, log-normaliser) [N] f32 by an online log-sum-exp over vocabulary chunks."""
    n, vocab = hidden.shape[0], weight.shape[0]

    def body(i, carry):
        m, s, t, tgt = carry
        start = i * chunk
        logits, allowed = _chunk_logits(hidden, weight, start, chunk, compute_dtype, temperature, states, table)
        m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(logits - m_new[:, None])
        if allowed is not None:   # a chunk with no allowed token must add nothing, whatever its running max
            e = jnp.where(allowed, e, 0.0)
        s = s * scale + e.sum(-1)
        t = t * scale + (e * logits).sum(-1)
        cols = start + jnp.arange(chunk)
        tgt = tgt + jnp.where(cols[None, :] == targets[:, None], logits, 0.0).sum(-1)
        return m_new, s, t, tgt

    init = (jnp.full((n,), -jnp.inf, jnp.float32), jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.float32),
            jnp.zeros((n,), jnp.float32))
    m, s, t, tgt = jax.lax.fori_loop(0, vocab // chunk, body, init)
    log_norm = m + jnp.log(s)
    return tgt - log_norm, log_norm - t / s, log_norm


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _fused(hidden, weight, targets, states, table, compute_dtype, temperature, chunk):
    picked, entropy, _ = _forward(hidden, weight, targets, states, table, compute_dtype, temperature, chunk)
    return picked, entropy


def _fused_fwd(hidden, weight, targets, states, table, compute_dtype, temperature, chunk):
    picked, entropy, log_norm = _forward(hidden, weight, targets, states, table, compute_dtype, temperature, chunk)
    return (picked, entropy), (hidden, weight, targets, states, table, log_norm)


def _fused_bwd(compute_dtype, temperature, chunk, residuals, cotangents):
    hidden, weight, targets, states, table, log_norm = residuals
    g = cotangents[0].astype(jnp.float32)               # the entropy output is a stat: no gradient flows from it
    dtype = _matmul_dtype(compute_dtype)
    vocab = weight.shape[0]
    h = hidden.astype(dtype)

    def body(i, carry):
        d_hidden, d_weight = carry
        start = i * chunk
        logits, allowed = _chunk_logits(hidden, weight, start, chunk, compute_dtype, temperature, states, table)
        probs = jnp.exp(logits - log_norm[:, None])
        onehot = (start + jnp.arange(chunk))[None, :] == targets[:, None]
        d_logits = g[:, None] * (onehot.astype(jnp.float32) - probs) / temperature    # d picked / d raw logits
        if allowed is not None:
            d_logits = jnp.where(allowed, d_logits, 0.0)
        d_logits = d_logits.astype(dtype)
        d_hidden = d_hidden + jnp.einsum("nv,ve->ne", d_logits, _weight_rows(weight, start, chunk, dtype),
                                         preferred_element_type=jnp.float32)
        d_w = jnp.einsum("nv,ne->ve", d_logits, h, preferred_element_type=jnp.float32)
        d_weight = jax.lax.dynamic_update_slice_in_dim(d_weight, d_w.astype(d_weight.dtype), start, axis=0)
        return d_hidden, d_weight

    init = (jnp.zeros(hidden.shape, jnp.float32), jnp.zeros(weight.shape, weight.dtype))
    d_hidden, d_weight = jax.lax.fori_loop(0, vocab // chunk, body, init)
    return d_hidden.astype(hidden.dtype), d_weight, None, None, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_logprobs(hidden: jax.Array, weight: jax.Array, targets: jax.Array, *, compute_dtype,
                   temperature: float = 1.0, states: jax.Array | None = None, allowed_table: jax.Array | None = None,
                   chunk: int = 0) -> tuple[jax.Array, jax.Array]:
    """hidden [N, E] and head weight [V, E] predicting targets [N] -> (logprobs, entropy) [N] float32.

    states [N] int32: the grammar state each target was drawn in (-1: unrestricted), rows of allowed_table [S, V].
    chunk: vocabulary entries per step (rounded down to a divisor of V; 0: the whole vocabulary at once).
    """
    vocab = weight.shape[0]
    if (states is None) != (allowed_table is None):
        raise ValueError("pass states and allowed_table together (or neither)")
    return _fused(hidden, weight, targets.astype(jnp.int32), None if states is None else states.astype(jnp.int32),
                  allowed_table, jnp.dtype(compute_dtype).name, float(temperature), vocab_chunk(vocab, chunk))


def token_logprobs(hidden: jax.Array, weight: jax.Array, input_ids: jax.Array, *, compute_dtype,
                   temperature: float = 1.0, states: jax.Array | None = None, allowed_table: jax.Array | None = None,
                   positions: jax.Array | None = None, chunk: int = 0, top_k: int = 0,
                   top_p: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """log π(x_t | x_<t) and the entropy of π(· | x_<t): hidden [B, T, E], head weight [V, E] -> ([B, T], [B, T]).

    Position 0 gets 0. positions [B, K] int32: compute only at these target positions t (1 ≤ t < T; 0 pads the
    bucket) and leave 0 elsewhere; None: every position. states [B, T] (or None) and allowed_table [S, V]: the
    grammar state of each token and the table of allowed tokens per state (-1: unrestricted).

    π is the sampler's distribution (`sampling_transform.sampling_logits`). Without truncation (top_k = 0,
    top_p = 1: the paper recipe) it is computed chunk by chunk as above. With top-k / top-p the kept set needs
    the whole sorted vocabulary, so the head runs densely on the K bucketed positions ([B, K, V], never
    [B, T, V]); a token outside the current kept set gets `LOGPROB_FLOOR`, with no gradient.
    """
    b, t = input_ids.shape
    input_ids = input_ids.astype(jnp.int32)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(1, t, dtype=jnp.int32)[None, :], (b, t - 1))
    positions = positions.astype(jnp.int32)
    k = positions.shape[1]
    valid = positions > 0
    source = jnp.take_along_axis(hidden, jnp.maximum(positions - 1, 0)[..., None], axis=1)     # [B, K, E]
    targets = jnp.take_along_axis(input_ids, positions, axis=1)
    picked_states = None if states is None else jnp.take_along_axis(states, positions, axis=1).reshape(-1)
    if truncates(temperature, top_k, top_p):
        lp, ent = _truncated_logprobs(source.reshape(b * k, -1), weight, targets.reshape(-1), picked_states,
                                      allowed_table, compute_dtype=compute_dtype, temperature=temperature,
                                      top_k=top_k, top_p=top_p)
    else:
        lp, ent = fused_logprobs(source.reshape(b * k, -1), weight, targets.reshape(-1),
                                 compute_dtype=compute_dtype, temperature=temperature, states=picked_states,
                                 allowed_table=allowed_table, chunk=chunk)
    rows = jnp.arange(b)[:, None]
    where = jnp.where(valid, positions, t)                                # out of range: dropped
    out = lambda x: jnp.zeros((b, t), jnp.float32).at[rows, where].set(
        jnp.where(valid, x.reshape(b, k), 0.0), mode="drop")
    return out(lp), out(ent)


def _truncated_logprobs(hidden, weight, targets, states, allowed_table, *, compute_dtype, temperature, top_k, top_p):
    """hidden [N, E] -> (logprobs, entropy) [N] f32 under the truncated sampling distribution (dense [N, V])."""
    allowed = None
    if states is not None:
        allowed = jnp.where(states[:, None] >= 0, allowed_table[jnp.maximum(states, 0)], True)
    processed = sampling_logits(head_logits(hidden, weight, compute_dtype), allowed, temperature=temperature,
                                top_k=top_k, top_p=top_p)
    log_probs = jax.nn.log_softmax(processed, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    inside = jnp.take_along_axis(processed, targets[:, None], axis=-1)[:, 0] > _MIN
    kept = processed > _MIN
    entropy = jax.lax.stop_gradient(-jnp.where(kept, jnp.exp(log_probs) * log_probs, 0.0).sum(-1))
    return jnp.where(inside, picked, LOGPROB_FLOOR), entropy


def loss_positions(loss_mask, multiple: int = 8) -> np.ndarray:
    """Host side: loss_mask [B, T] -> positions [B, K] int32 of its nonzero entries t ≥ 1 (row-major order, 0
    padded), K the largest row count rounded up to a power of two (at least `multiple`, at most T): a few
    static bucket sizes, so the jitted update compiles a handful of shapes."""
    mask = np.asarray(loss_mask) > 0
    mask[:, 0] = False
    count = int(mask.sum(axis=1).max(initial=0))
    k = min(max(multiple, 1 << max(0, count - 1).bit_length()), mask.shape[1])
    out = np.zeros((mask.shape[0], k), np.int32)
    for row in range(mask.shape[0]):
        idx = np.flatnonzero(mask[row])
        out[row, :len(idx)] = idx
    return out
