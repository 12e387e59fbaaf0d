"""Per-token KL estimators between two policies from sampled-token log-probs (Schulman's k1/k2/k3).

With log ratio d = logprobs - base_logprobs (fp32):
  k1 = d                      (unbiased, can be negative)
  k2 = d^2 / 2                (non-negative, low variance)
  k3 = exp(-d) - 1 + d        (non-negative, unbiased for KL(pi || base) under samples from pi)
`binary_kl` is KPop's metric: the KL between the two Bernoulli laws "this token / any other token".
"""

from __future__ import annotations

import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k2", "k3")


def estimator_problem(estimator) -> str | None:
    """What is wrong with a KL estimator's name (actor.kl_estimator, actor.kl_loss_estimator), or None."""
    return None if estimator in KL_ESTIMATORS else f"use one of {KL_ESTIMATORS}"


def kl_estimate(logprobs, base_logprobs, estimator: str = "k1", clamp: float | None = None):
    """Per-token KL estimate [..] float32 of `logprobs` against `base_logprobs` (same shape)."""
    fix = estimator_problem(estimator)
    if fix is not None:
        raise ValueError(f"kl_estimator={estimator!r}: {fix}")
    d = jnp.asarray(logprobs, jnp.float32) - jnp.asarray(base_logprobs, jnp.float32)
    if estimator == "k1":
        out = d
    elif estimator == "k2":
        out = 0.5 * d * d
    else:
        out = jnp.expm1(-d) + d
    if clamp is not None:
        out = jnp.clip(out, -clamp, clamp)
    return out


def binary_kl(logprobs, base_logprobs, eps: float = 1e-6):
    """KL(Bern(p) || Bern(q)) with p = exp(logprobs), q = exp(base_logprobs), per token, float32."""
    p = jnp.clip(jnp.exp(jnp.asarray(logprobs, jnp.float32)), eps, 1.0 - eps)
    q = jnp.clip(jnp.exp(jnp.asarray(base_logprobs, jnp.float32)), eps, 1.0 - eps)
    return p * (jnp.log(p) - jnp.log(q)) + (1.0 - p) * (jnp.log1p(-p) - jnp.log1p(-q))
