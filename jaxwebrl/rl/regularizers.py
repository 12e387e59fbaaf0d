"""The term added to the actor loss, a KL penalty to the reference policy, and the whole actor objective.

    total, stats = actor_objective("ppo", logprobs, prox, behave, advantages, loss_mask, ref_logprobs=ref,
                                   kl_coef=0.05)

Every input is [B, T] (as the losses', `losses.py`); the terms aggregate like the losses (`aggregation.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwebrl.rl import aggregation
from jaxwebrl.rl import kl as kl_lib
from jaxwebrl.rl.losses import get_loss, loss_default, loss_kwarg_names


def kl_loss(logprobs, base_logprobs, loss_mask, *, estimator="k3", agg_mode="token-mean", agg_normalizer=None,
            segment_ids=None):
    """KL penalty of the current policy to a reference or proximal policy (base is stop-gradient).
    Returns (loss, {"kl"})."""
    valid = jnp.asarray(loss_mask).astype(bool)
    lp = jnp.where(valid, jnp.asarray(logprobs, jnp.float32), 0.0)
    base = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(base_logprobs, jnp.float32), 0.0))
    kl = jnp.where(valid, kl_lib.kl_estimate(lp, base, estimator), 0.0)
    value = aggregation.aggregate(kl, valid, agg_mode, segment_ids=segment_ids, normalizer=agg_normalizer)
    return value, {"kl": jax.lax.stop_gradient(value)}


def actor_objective(name, logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, loss_kwargs=(),
                    ref_logprobs=None, kl_coef=0.0, kl_estimator="k3"):
    """Registered loss + `kl_coef` × KL to `ref_logprobs` [B, T] (train.kl_loss_coef), the KL aggregated like the
    loss (its agg_mode and agg_normalizer, as veRL's use_kl_loss)."""
    loss_kwargs = dict(loss_kwargs)
    loss, stats = get_loss(name)(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, **loss_kwargs)
    stats = dict(stats, policy_loss=stats["loss"])
    if kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs [B, T] (the reference policy's)")
        kl_value, kl_stats = kl_loss(logprobs, ref_logprobs, loss_mask, estimator=kl_estimator,
                                     **_aggregation(name, loss_kwargs))
        loss = loss + kl_coef * kl_value
        stats.update(kl_stats)
    stats["loss"] = jax.lax.stop_gradient(loss)
    return loss, stats


def _aggregation(name, loss_kwargs: dict) -> dict:
    """The agg_mode / agg_normalizer loss `name` runs with under `loss_kwargs` ({}: it takes none, token-mean)."""
    accepted = loss_kwarg_names(name)
    return {key: loss_kwargs.get(key, loss_default(name, key)) for key in ("agg_mode", "agg_normalizer")
            if key in accepted}
