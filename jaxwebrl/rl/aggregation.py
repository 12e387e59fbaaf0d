"""Reducing per-token losses to a scalar, and per-sequence reductions (rows, or packed segments).

Modes:
  "token-mean"               sum over valid tokens / number of valid tokens in the whole minibatch
                             (default; the paper's step 7). Tokens dropped by a cap stay in the denominator.
  "seq-mean-token-mean"      mean over sequences of each sequence's token mean (GSPO's outer mean).
  "seq-mean-token-sum-norm"  Dr.GRPO: mean over sequences of (token sum / a constant normaliser); the
                             normaliser is required, the response-token budget (`model.max_new_tokens`, the
                             Dr.GRPO paper's choice): anything tied to the padded width would change the loss
                             with the batch's bucket and count prompt tokens.

A sequence is a row of [B, T], or, with `segment_ids` [B, T] (packed rows), a (row, segment id) pair.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxwebrl.rl import segments

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def sequence_index(shape, segment_ids=None):
    """Flat sequence index [B*T] int32 and the static number of sequence slots."""
    batch, time = shape
    rows = jnp.broadcast_to(jnp.arange(batch, dtype=jnp.int32)[:, None], shape)
    if segment_ids is None:
        return rows.reshape(-1), batch
    seg = jnp.clip(jnp.asarray(segment_ids).astype(jnp.int32), 0, time - 1)
    return (rows * time + seg).reshape(-1), batch * time


def sequence_sum(x, segment_ids=None):
    """Per-sequence sums of x [B, T]: [num_sequence_slots] float32."""
    x = jnp.asarray(x, jnp.float32)
    if segment_ids is None:
        return x.sum(axis=-1)
    index, n = sequence_index(x.shape, segment_ids)
    return segments.segment_sum(x.reshape(-1), index, n)


def sequence_max(x, mask, segment_ids=None):
    """Per-sequence max of x over mask; sequences without valid tokens give 0."""
    x = jnp.asarray(x, jnp.float32)
    masked = jnp.where(mask, x, -jnp.inf)
    if segment_ids is None:
        out = masked.max(axis=-1)
    else:
        index, n = sequence_index(x.shape, segment_ids)
        out = segments.segment_max(masked.reshape(-1), index, n)
    return jnp.where(jnp.isfinite(out), out, 0.0)


def to_tokens(per_sequence, shape, segment_ids=None):
    """Broadcast per-sequence values back to tokens [B, T]."""
    if segment_ids is None:
        return jnp.broadcast_to(per_sequence[:, None], shape)
    index, _ = sequence_index(shape, segment_ids)
    return per_sequence[index].reshape(shape)


def sequence_mean(x, mask, segment_ids=None):
    """Per-sequence mean of x over valid tokens, broadcast to tokens [B, T] (0 for empty sequences)."""
    m = jnp.asarray(mask, jnp.float32)
    total = sequence_sum(jnp.asarray(x, jnp.float32) * m, segment_ids)
    count = sequence_sum(m, segment_ids)
    return to_tokens(total / jnp.maximum(count, 1.0), m.shape, segment_ids)


def aggregate(per_token, loss_mask, mode: str = "token-mean", *, segment_ids=None,
              normalizer: float | None = None):
    """Scalar float32 from per-token values [B, T] that are already 0 off the kept tokens.

    `loss_mask` [B, T] is the *denominator* mask (all valid tokens, including any dropped ones).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {AGG_MODES}")
    per_token = jnp.asarray(per_token, jnp.float32)
    m = jnp.asarray(loss_mask, jnp.float32)
    if mode == "token-mean":
        return per_token.sum() / jnp.maximum(m.sum(), 1.0)
    seq_total = sequence_sum(per_token, segment_ids)
    seq_count = sequence_sum(m, segment_ids)
    present = seq_count > 0
    n_seq = jnp.maximum(present.sum(), 1).astype(jnp.float32)
    if mode == "seq-mean-token-mean":
        per_seq = seq_total / jnp.maximum(seq_count, 1.0)
    else:
        if normalizer is None or not float(normalizer) > 0:
            raise ValueError(f"agg mode {mode!r} needs a constant normalizer > 0 (got {normalizer}): pass the "
                             "response-token budget, e.g. agg_normalizer=model.max_new_tokens")
        per_seq = seq_total / float(normalizer)
    return jnp.where(present, per_seq, 0.0).sum() / n_seq
