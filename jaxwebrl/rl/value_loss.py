"""The critic's loss: a clipped squared error against the GAE returns (AReaL's `ppo_critic_loss_fn`, "mse").

    loss, stats = clipped_value_loss(values, old_values, returns, mask, value_eps_clip=0.2)

  v_clip = v_old + clip(v - v_old, -ε_v, ε_v)
  loss_t = max(½ (v - R)², ½ (v_clip - R)²)            (ε_v = None: ½ (v - R)², no clip)
  loss   = Σ_t mask_t loss_t / Σ_t mask_t                (token mean over the masked tokens)

All inputs [B, T]; `values` carries the gradient, `old_values` (the critic's values before this train step's
updates) and `returns` are stop-gradient targets. Pure jnp.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def check_value_clip(value_eps_clip) -> None:
    """`value_eps_clip`: None (no clip) or a number > 0; ValueError otherwise."""
    if value_eps_clip is not None and (isinstance(value_eps_clip, bool) or not value_eps_clip > 0):
        raise ValueError(f"value_eps_clip={value_eps_clip!r}: must be > 0 (AReaL: 0.2) or None for no clip")


def clipped_value_loss(values, old_values, returns, mask, *, value_eps_clip: float | None = 0.2):
    """(loss float32 scalar, {"value_loss", "value_clip_ratio", "value_mean", "return_mean"}) over the masked
    tokens of [B, T] inputs (see the module docstring). `value_clip_ratio`: fraction of tokens where the clipped
    term is the larger one (AReaL's clip_mask)."""
    check_value_clip(value_eps_clip)
    shape = jnp.shape(values)
    for name, arr in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if jnp.shape(arr) != shape:
            raise ValueError(f"{name} shape {jnp.shape(arr)} != values shape {shape}")
    return _clipped_value_loss(values, old_values, returns, mask, value_eps_clip=value_eps_clip)


@functools.partial(jax.jit, static_argnames=("value_eps_clip",))
def _clipped_value_loss(values, old_values, returns, mask, *, value_eps_clip):
    valid = jnp.asarray(mask).astype(bool)
    v = jnp.where(valid, jnp.asarray(values, jnp.float32), 0.0)
    old = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(old_values, jnp.float32), 0.0))
    target = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(returns, jnp.float32), 0.0))
    plain = 0.5 * jnp.square(v - target)
    if value_eps_clip is None:
        per_token, clipped = plain, jnp.zeros_like(valid)
    else:
        v_clip = old + jnp.clip(v - old, -value_eps_clip, value_eps_clip)
        clipped_term = 0.5 * jnp.square(v_clip - target)
        per_token = jnp.maximum(plain, clipped_term)
        clipped = clipped_term > plain
    count = jnp.maximum(valid.sum(), 1).astype(jnp.float32)
    mean = lambda x: jnp.where(valid, x, 0.0).astype(jnp.float32).sum() / count  # noqa: E731
    loss = mean(per_token)
    stats = {"value_loss": jax.lax.stop_gradient(loss), "value_clip_ratio": mean(clipped),
             "value_mean": jax.lax.stop_gradient(mean(v)), "return_mean": mean(target)}
    return loss, stats
