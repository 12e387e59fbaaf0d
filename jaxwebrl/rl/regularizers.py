"""Terms added to the actor loss: an entropy bonus and a KL penalty, and the whole actor objective.

    total, stats = actor_objective("ppo", logprobs, prox, behave, advantages, loss_mask, entropy=entropy,
                                   entropy_coef=0.01, ref_logprobs=ref, kl_coef=0.05)

Every input is [B, T] (as the losses', `losses.py`); the terms aggregate like the losses (`aggregation.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwebrl.rl import aggregation
from jaxwebrl.rl import kl as kl_lib
from jaxwebrl.rl.losses import get_loss


def entropy_from_logits(logits, *, temperature: float = 1.0):
    """Per-token entropy of the softmax over the vocabulary: [B, T, V] -> [B, T] float32."""
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32) / temperature, axis=-1)
    return -(jnp.exp(logp) * logp).sum(axis=-1)


def entropy_loss(entropy, loss_mask, *, agg_mode="token-mean", agg_normalizer=None, segment_ids=None):
    """-aggregate(entropy) over policy tokens (minimising it raises entropy). Returns (loss, {"entropy"})."""
    valid = jnp.asarray(loss_mask).astype(bool)
    ent = jnp.where(valid, jnp.asarray(entropy, jnp.float32), 0.0)
    value = aggregation.aggregate(ent, valid, agg_mode, segment_ids=segment_ids, normalizer=agg_normalizer)
    return -value, {"entropy": jax.lax.stop_gradient(value)}


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
                    entropy=None, entropy_coef=0.0, ref_logprobs=None, kl_coef=0.0, kl_estimator="k3",
                    kl_to="reference"):
    """Registered loss + entropy bonus + KL penalty (to `ref_logprobs`, or to the proximal policy)."""
    loss, stats = get_loss(name)(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask,
                                 **dict(loss_kwargs))
    stats = dict(stats, policy_loss=stats["loss"])
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy [B, T] (see entropy_from_logits)")
        ent_loss, ent_stats = entropy_loss(entropy, loss_mask)
        loss = loss + entropy_coef * ent_loss
        stats.update(ent_stats)
    if kl_coef:
        if kl_to not in ("reference", "proximal"):
            raise ValueError(f"kl_to must be 'reference' or 'proximal', got {kl_to!r}")
        base = prox_logprobs if kl_to == "proximal" else ref_logprobs
        if base is None:
            raise ValueError("kl_coef > 0 with kl_to='reference' needs ref_logprobs [B, T]")
        kl_value, kl_stats = kl_loss(logprobs, base, loss_mask, estimator=kl_estimator)
        loss = loss + kl_coef * kl_value
        stats.update(kl_stats)
    stats["loss"] = jax.lax.stop_gradient(loss)
    return loss, stats
