"""Decoupled-loss behaviour weight w = exp(prox - behave), its dropping cap, and rejection sampling.

* `behav_imp_weight_cap`: tokens with w > cap are DROPPED (contribute 0) — not clipped — and stay in the
  loss denominator. Logged as `behave_cap_ratio` (fraction of valid tokens dropped).
* `RejectionConfig` (IcePop / KPop): a metric of the proximal-vs-behaviour gap, per token or per
  sequence, with bounds; `action="mask"` rejects out-of-bound tokens (they stay in the denominator),
  `action="clamp"` clamps w into [lower, upper] instead (ratio metric only).
    metric "ratio"      w itself (sequence level: geometric mean for agg "mean", product for "sum", largest
                        token weight for "max"). At sequence level the weight itself becomes the sequence's
                        geometric-mean weight on every token (AReaL's apply_rejection_sampling), clamped into
                        the bounds when action="clamp" and the sequence is out of them.
    metric "binary_kl"  KPop: KL(Bern(p_prox) || Bern(p_behave)) of the sampled token (upper bound only)
    metric "kl_k1|k2|k3" the per-token KL estimators of prox against behave
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxwebrl.rl import aggregation
from jaxwebrl.rl import kl as kl_lib

METRICS = ("ratio", "binary_kl", "kl_k1", "kl_k2", "kl_k3")


@dataclasses.dataclass(frozen=True)
class RejectionConfig:
    """Rejection sampling of stale tokens (hashable; a static argument under jit)."""

    metric: str = "ratio"
    level: str = "token"
    action: str = "mask"
    lower: float | None = None
    upper: float = 5.0
    agg: str = "mean"

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"rejection metric must be one of {METRICS}, got {self.metric!r}")
        if self.level not in ("token", "sequence"):
            raise ValueError(f"rejection level must be 'token' or 'sequence', got {self.level!r}")
        if self.action not in ("mask", "clamp"):
            raise ValueError(f"rejection action must be 'mask' or 'clamp', got {self.action!r}")
        if self.agg not in ("mean", "sum", "max"):
            raise ValueError(f"rejection agg must be 'mean', 'sum' or 'max', got {self.agg!r}")
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError(f"action='clamp' bounds the weight itself: use metric='ratio' (got {self.metric!r}), "
                             "or action='mask'")
        if self.metric == "binary_kl" and self.lower is not None:
            raise ValueError("metric='binary_kl' (KPop) takes an upper bound only: set lower=None")
        if self.lower is not None and self.lower > self.upper:
            raise ValueError(f"rejection lower={self.lower} > upper={self.upper}")


def icepop(lower: float = 0.5, upper: float = 5.0, level: str = "token") -> RejectionConfig:
    """IcePop: mask tokens whose behaviour ratio leaves [lower, upper]."""
    return RejectionConfig(metric="ratio", level=level, action="mask", lower=lower, upper=upper)


def kpop(upper: float = 2.0, level: str = "token") -> RejectionConfig:
    """KPop: mask tokens whose binary KL between proximal and behaviour exceeds `upper`."""
    return RejectionConfig(metric="binary_kl", level=level, action="mask", upper=upper)


def _in_bounds(metric, config: RejectionConfig):
    ok = metric <= config.upper
    if config.lower is not None:
        ok = ok & (metric >= config.lower)
    return ok


def behaviour_weight(prox_logprobs, behave_logprobs, loss_mask, *, cap=None,
                     rejection: RejectionConfig | None = None, segment_ids=None):
    """Behaviour weight and which tokens keep it.

    Args:
      prox_logprobs, behave_logprobs: [B, T] float32, already stop-gradient and 0 off the mask.
      loss_mask: [B, T] bool valid tokens.

    Returns:
      (w [B, T] float32, kept [B, T] bool, dropped_by_cap [B, T] bool, rejected [B, T] bool); `rejected`
      counts tokens masked or clamped by rejection sampling.
    """
    log_w = jnp.where(loss_mask, prox_logprobs - behave_logprobs, 0.0)
    w = jnp.exp(log_w)
    dropped = jnp.zeros(loss_mask.shape, bool)
    if cap is not None:
        dropped = loss_mask & (w > cap)
    kept = loss_mask & ~dropped
    rejected = jnp.zeros(loss_mask.shape, bool)
    if rejection is not None:
        w, in_bounds, rejected = _apply_rejection(prox_logprobs, behave_logprobs, loss_mask, log_w, w,
                                                  rejection, segment_ids)
        kept = kept & in_bounds
    return w, kept, dropped, rejected


def _apply_rejection(prox, behave, mask, log_w, w, config: RejectionConfig, segment_ids):
    if config.metric == "ratio":
        metric = w
    elif config.metric == "binary_kl":
        metric = kl_lib.binary_kl(prox, behave)
    else:
        metric = kl_lib.kl_estimate(prox, behave, config.metric[3:])
    metric = jnp.where(mask, metric, 0.0)
    if config.level == "sequence":
        m = mask.astype(jnp.float32)
        values = log_w if config.metric == "ratio" else metric
        if config.agg == "max":
            seq = aggregation.sequence_max(metric, mask, segment_ids)
        else:
            total = aggregation.sequence_sum(values * m, segment_ids)
            seq = total if config.agg == "sum" else total / jnp.maximum(aggregation.sequence_sum(m, segment_ids), 1.0)
            if config.metric == "ratio":
                seq = jnp.exp(seq)
        ok = aggregation.to_tokens(_in_bounds(seq, config), mask.shape, segment_ids)
        if config.metric == "ratio":  # one weight per sequence: its geometric mean (the "length trap" of a mean)
            w = jnp.where(mask, jnp.exp(aggregation.sequence_mean(log_w, mask, segment_ids)), 1.0)
    else:
        ok = _in_bounds(metric, config)
    if config.action == "mask":
        return w, ok | ~mask, mask & ~ok
    lower = 0.0 if config.lower is None else config.lower
    clamped = jnp.where(ok, w, jnp.clip(w, lower, config.upper))
    return clamped, jnp.ones(mask.shape, bool), mask & (clamped != w)
