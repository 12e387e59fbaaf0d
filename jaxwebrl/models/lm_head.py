"""The LM head and per-token log-probs without the full [B, T, V] logits.

At paper scale (151,936-token vocabulary, 16,384-token rows) full-vocabulary fp32 logits and their log-softmax
are ~10 GB per row; the log-prob of the sampled token needs none of that at once. `token_logprobs` computes it
from the decoder's hidden states:

- on the positions that carry loss only, gathered into a static bucket (`positions [B, K]`), or on every
  position when no bucket is given;
- `chunk` positions at a time, each chunk's logits -> temperature -> grammar restriction -> log-softmax -> pick
  fused under `jax.checkpoint` inside a scan, so only one chunk's [B, chunk, V] logits exist at a time, in the
  forward and in the backward pass (which recomputes them);
- with the per-token entropy of the same (restricted, tempered) distribution as a stat (no gradient).

The numbers are those of `log_softmax(where(allowed, logits / temperature, min))[target]` on the full logits.
The head runs in fp32 when the model computes in fp32 (the tiny default), otherwise in the compute dtype with
fp32 accumulation (bf16 hidden states times the head; the same products the fp32 cast of bf16 values gives).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_MIN = float(jnp.finfo(jnp.float32).min)


def head_weight(params, tied: bool) -> tuple[jax.Array, str]:
    """(weight, layout): the tied embedding table [V, E] ("ve") or the head kernel [E, V] ("ev")."""
    if tied:
        return params["language_model"]["embed_tokens"]["embedding"], "ve"
    return params["lm_head"]["kernel"], "ev"


def head_logits(hidden: jax.Array, weight: jax.Array, layout: str, compute_dtype) -> jax.Array:
    """hidden [..., E] -> logits [..., V] float32 (see the module docstring for the precision)."""
    dtype = jnp.float32 if jnp.dtype(compute_dtype) == jnp.float32 else jnp.dtype(compute_dtype)
    spec = "...e,ve->...v" if layout == "ve" else "...e,ev->...v"
    return jnp.einsum(spec, hidden.astype(dtype), weight.astype(dtype), preferred_element_type=jnp.float32)


def _chunk_stats(hidden, weight, layout, compute_dtype, targets, allowed, temperature):
    """One chunk: hidden [B, C, E], targets [B, C] int, allowed [B, C, V] bool or None -> (logprob, entropy) [B, C]."""
    logits = head_logits(hidden, weight, layout, compute_dtype) / temperature
    if allowed is not None:
        logits = jnp.where(allowed, logits, _MIN)
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    log_norm = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    picked = jnp.take_along_axis(shifted, targets[..., None], axis=-1)[..., 0] - log_norm
    logp = jax.lax.stop_gradient(shifted - log_norm[..., None])
    probs = jnp.exp(logp)
    entropy = -jnp.sum(jnp.where(probs > 0, probs * logp, 0.0), axis=-1)
    return picked, entropy


def chunked_logprobs(hidden: jax.Array, weight: jax.Array, layout: str, targets: jax.Array, *, compute_dtype,
                     temperature: float = 1.0, states: jax.Array | None = None, allowed_table: jax.Array | None = None,
                     chunk: int = 0) -> tuple[jax.Array, jax.Array]:
    """hidden [B, N, E] predicting targets [B, N] -> (logprobs, entropy) [B, N] float32, `chunk` positions at a time.

    states [B, N] int32: the grammar state each target was drawn in (-1: unrestricted), rows of allowed_table [S, V].
    chunk = 0 (or N ≤ chunk): one pass over all N positions.
    """
    def allowed_of(st):
        if st is None or allowed_table is None:
            return None
        return jnp.where(st[..., None] >= 0, allowed_table[jnp.maximum(st, 0)], True)

    b, n, _ = hidden.shape
    if chunk <= 0 or n <= chunk:
        return _chunk_stats(hidden, weight, layout, compute_dtype, targets, allowed_of(states), temperature)
    pad = -n % chunk
    count = (n + pad) // chunk

    def split(x, fill):
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2), constant_values=fill)
        return jnp.moveaxis(x.reshape(b, count, chunk, *x.shape[2:]), 1, 0)

    xs = (split(hidden, 0), split(targets, 0), None if states is None else split(states, -1))

    @jax.checkpoint
    def body(h, t, st):
        return _chunk_stats(h, weight, layout, compute_dtype, t, allowed_of(st), temperature)

    picked, entropy = jax.lax.map(lambda x: body(*x), xs)           # [count, B, chunk]
    unsplit = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, count * chunk)[:, :n]
    return unsplit(picked), unsplit(entropy)


def token_logprobs(hidden: jax.Array, weight: jax.Array, layout: str, input_ids: jax.Array, *, compute_dtype,
                   temperature: float = 1.0, states: jax.Array | None = None, allowed_table: jax.Array | None = None,
                   positions: jax.Array | None = None, chunk: int = 0) -> tuple[jax.Array, jax.Array]:
    """log π(x_t | x_<t) and the entropy of π(· | x_<t): hidden [B, T, E] -> ([B, T], [B, T]) float32.

    Position 0 gets 0. positions [B, K] int32: compute only at these target positions t (1 ≤ t < T; 0 pads the
    bucket) and leave 0 elsewhere; None: every position. states [B, T] (or None) and allowed_table [S, V]: the
    grammar state of each token and the table of allowed tokens per state (-1: unrestricted).
    """
    b, t = input_ids.shape
    input_ids = input_ids.astype(jnp.int32)
    kw = dict(compute_dtype=compute_dtype, temperature=temperature, allowed_table=allowed_table, chunk=chunk)
    if positions is None:
        lp, ent = chunked_logprobs(hidden[:, :-1], weight, layout, input_ids[:, 1:],
                                   states=None if states is None else states[:, 1:], **kw)
        return jnp.pad(lp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))
    positions = positions.astype(jnp.int32)
    valid = positions > 0
    rows = jnp.arange(b)[:, None]
    source = jnp.take_along_axis(hidden, jnp.maximum(positions - 1, 0)[..., None], axis=1)     # [B, K, E]
    targets = jnp.take_along_axis(input_ids, positions, axis=1)
    picked_states = None if states is None else jnp.take_along_axis(states, positions, axis=1)
    lp, ent = chunked_logprobs(source, weight, layout, targets, states=picked_states, **kw)
    where = jnp.where(valid, positions, t)                                # out of range: dropped
    out = lambda x: jnp.zeros((b, t), jnp.float32).at[rows, where].set(jnp.where(valid, x, 0.0), mode="drop")
    return out(lp), out(ent)


def loss_positions(loss_mask, multiple: int = 8):
    """Host side: loss_mask [B, T] -> positions [B, K] int32 of its nonzero entries t ≥ 1 (row-major order, 0
    padded), K the largest row count rounded up to a power of two (at least `multiple`, at most T): a few
    static bucket sizes, so the jitted update compiles a handful of shapes."""
    import numpy as np

    mask = np.asarray(loss_mask) > 0
    mask[:, 0] = False
    count = int(mask.sum(axis=1).max(initial=0))
    k = max(multiple, 1 << max(0, count - 1).bit_length())
    k = min(k, mask.shape[1])
    out = np.zeros((mask.shape[0], k), np.int32)
    for row in range(mask.shape[0]):
        idx = np.flatnonzero(mask[row])
        out[row, :len(idx)] = idx
    return out
