"""The sampling transform: the distribution a token is drawn from, as logits (constraint, temperature, top-k,
top-p). The sampler draws from it and the trainer replays it (`lm_head.token_logprobs`), so both sides agree to
the last bit of the transform and every importance weight compares like with like.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = float(jnp.finfo(jnp.float32).min)   # "excluded" logit: finite, so log-probs stay finite

# log(smallest normal float32): the replayed log-prob of a token outside the current truncated (top-k / top-p)
# distribution. Its probability there is 0; the floor keeps ratios exp(lp - prox) at 0 and statistics finite.
LOGPROB_FLOOR = float(np.log(np.finfo(np.float32).tiny))


def sampling_logits(logits: jax.Array, allowed: jax.Array | None = None, *, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """The distribution tokens are drawn from, as logits: softmax of the result is what the sampler samples and
    what the trainer replays (one function, so both sides agree to the last bit of the transform).

    Args:
      logits: [..., V] model logits.
      allowed: [..., V] bool tokens the constraint admits, or None (every token).
      temperature: > 0; the logits are divided by it.
      top_k: 0 = off; else only the k largest tempered logits stay.
      top_p: 1 = off; else the smallest most-likely set holding top_p of the (top-k) mass stays; the most likely
        token always does.

    Returns:
      [..., V] float32: tempered logits, float32's lowest value outside the kept set (finite, so a token outside it
      gets a finite, hugely negative log-prob instead of NaN). Which tokens are kept is not differentiated.
    """
    if not temperature > 0:
        raise ValueError(f"sampling_logits needs temperature > 0 (greedy decoding takes the argmax), got {temperature}")
    x = logits.astype(jnp.float32)
    if temperature != 1.0:
        x = x / jnp.float32(temperature)
    if allowed is not None:
        x = jnp.where(allowed, x, NEG_INF)
    if top_k:
        kth = jax.lax.stop_gradient(jax.lax.top_k(x, min(top_k, x.shape[-1]))[0][..., -1:])
        x = jnp.where(x >= kth, x, NEG_INF)
    if top_p < 1:
        sorted_logits = jax.lax.stop_gradient(jnp.sort(x, axis=-1)[..., ::-1])
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < top_p  # the most likely token is always kept
        threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(x >= threshold, x, NEG_INF)
    return x


def truncates(temperature: float, top_k: int, top_p: float) -> bool:
    """Whether these settings cut tokens out of the distribution (top-k or top-p), beyond the temperature."""
    return temperature > 0 and (top_k > 0 or top_p < 1)
