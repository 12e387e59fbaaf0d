"""The PPO-family actor losses, selected by name: every recipe is a config switch.

(One module past ~400 lines on purpose: the family's members differ in a few lines each and are read side by side,
against each other and against AReaL's formulas, with the registry that names them. Entropy and KL terms and the
whole actor objective are `regularizers.py`.)

All losses take `(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)`, each [B, T]
(`logprobs` carries the gradient; the other three are stop-gradient evidence), and return
`(loss, stats)`: a float32 scalar and a dict of float32 scalars with at least `STAT_KEYS`.

  ratio ρ = exp(logprobs - prox)           (fp32; against the proximal policy)
  behaviour weight w = exp(prox - behave)   (decoupled loss; pass behave = prox for the coupled case)
  tokens with w > behav_imp_weight_cap are dropped (0) and stay in the denominator
  M2PO (`m2_threshold`): before all that, the tokens with the largest (prox - behave)² leave the minibatch,
  denominator included, until the mean of the rest is below the threshold (AReaL's _apply_m2po_masking)

Statistics: the behaviour-gap stats (`behave_approx_kl[_abs]`, `behave_imp_weight`) average over the tokens
that keep their weight (not dropped by the cap, not rejected), as AReaL's `behave_mask`; the rest over every
valid token.

Masked-out tokens are sanitised before any exp, so a padding token with garbage or a huge advantage
gets exactly zero gradient. Every public loss jits its body with the hyper-parameters static, so it is
fast on NumPy inputs eagerly and inlines inside an outer `jax.jit`.
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp

from jaxwebrl.rl import aggregation
from jaxwebrl.rl import rejection as rejection_lib
from jaxwebrl.rl import segments
from jaxwebrl.rl.rejection import RejectionConfig

STAT_KEYS = ("loss", "clip_ratio", "dual_clip_ratio", "behave_cap_ratio", "rejection_ratio", "approx_kl",
             "approx_kl_abs", "behave_approx_kl", "behave_approx_kl_abs", "importance_weight",
             "behave_imp_weight", "n_valid_tokens")

# ----------------------------------------------------------------------------------- plumbing


def _check_inputs(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, segment_ids=None):
    shape = jnp.shape(logprobs)
    if len(shape) != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {shape}")
    for name, arr in (("prox_logprobs", prox_logprobs), ("behave_logprobs", behave_logprobs),
                      ("advantages", advantages), ("loss_mask", loss_mask), ("segment_ids", segment_ids)):
        if arr is not None and jnp.shape(arr) != shape:
            raise ValueError(f"{name} shape {jnp.shape(arr)} != logprobs shape {shape}; all inputs are [B, T]")


# The knobs' allowed values, the one rule of the losses and of config validation (`actor.*`, rl_config.LOSS_KNOBS).
# The cap: w = exp(prox - behave) is 1 on-policy and tokens with w > cap are dropped, so a cap <= 1 drops on-policy
# tokens (below 1 all of them; at 1 every one a rounding error of the proximal recompute puts above 1).
KNOB_RULES = {
    "eps_clip": (lambda v: 0 < v < 1, "the PPO clip must be in (0, 1), e.g. 0.2"),
    "eps_clip_higher": (lambda v: v > 0, "the upper clip must be > 0 (DAPO: 0.28) or None"),
    "c_clip": (lambda v: v > 1, "the dual clip must be > 1 (e.g. 3.0) or None to disable it"),
    "behav_imp_weight_cap": (lambda v: v > 1, "the behaviour-weight cap must be > 1 (e.g. 5.0) or None"),
    "m2_threshold": (lambda v: v > 0, "must be > 0 (e.g. 0.04) or None"),
    "tau_pos": (lambda v: v > 0, "the SAPO temperature must be > 0 or None (the loss's default)"),
    "tau_neg": (lambda v: v > 0, "the SAPO temperature must be > 0 or None (the loss's default)"),
}


def knob_problem(name: str, value) -> str | None:
    """Why `value` is not allowed for loss knob `name` (KNOB_RULES), or None when it is (None is always allowed)."""
    if value is None or name not in KNOB_RULES:
        return None
    ok, fix = KNOB_RULES[name]
    return None if ok(value) else fix


def check_knobs(**knobs) -> None:
    """ValueError `name=value: fix` for the first knob KNOB_RULES refuses."""
    for name, value in knobs.items():
        fix = knob_problem(name, value)
        if fix is not None:
            raise ValueError(f"{name}={value!r}: {fix}")


def _as_rejection(rejection):
    if rejection is None or isinstance(rejection, RejectionConfig):
        return rejection
    if isinstance(rejection, dict):
        return RejectionConfig(**rejection)
    if isinstance(rejection, tuple):
        return RejectionConfig(**dict(rejection))
    raise ValueError(f"rejection must be a RejectionConfig, a dict or (name, value) pairs, got {type(rejection)}")


def _prepare(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask):
    """fp32, stop-gradient on the evidence, everything 0 off the mask (before any exp)."""
    valid = jnp.asarray(loss_mask).astype(bool)
    lp = jnp.where(valid, jnp.asarray(logprobs, jnp.float32), 0.0)
    sg = jax.lax.stop_gradient
    prox = sg(jnp.where(valid, jnp.asarray(prox_logprobs, jnp.float32), 0.0))
    behave = sg(jnp.where(valid, jnp.asarray(behave_logprobs, jnp.float32), 0.0))
    adv = sg(jnp.where(valid, jnp.asarray(advantages, jnp.float32), 0.0))
    return lp, prox, behave, adv, valid


def _stats(loss, lp, prox, behave, valid, ratio, w, kept, dropped, rejected, clip_mask=None, dual_mask=None,
           **extra):
    sg = jax.lax.stop_gradient
    lp, ratio, w = sg(lp), sg(ratio), sg(w)
    m = valid.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)

    def frac(b):
        return (b & valid).astype(jnp.float32).sum() / n

    def mean(x, over=valid):
        o = over.astype(jnp.float32)
        return jnp.where(over, x, 0.0).sum() / jnp.maximum(o.sum(), 1.0)

    zeros = jnp.zeros(valid.shape, bool)
    out = dict(
        loss=sg(loss).astype(jnp.float32),
        clip_ratio=frac(zeros if clip_mask is None else clip_mask),
        dual_clip_ratio=frac(zeros if dual_mask is None else dual_mask),
        behave_cap_ratio=frac(dropped),
        rejection_ratio=frac(rejected),
        approx_kl=mean(lp - prox),
        approx_kl_abs=mean(jnp.abs(lp - prox)),
        behave_approx_kl=mean(prox - behave, kept),
        behave_approx_kl_abs=mean(jnp.abs(prox - behave), kept),
        importance_weight=mean(ratio),
        behave_imp_weight=mean(w, kept),
        n_valid_tokens=m.sum(),
    )
    out.update({k: sg(jnp.asarray(v, jnp.float32)) for k, v in extra.items()})
    return out


def _clip_bounds(eps_clip, eps_clip_higher):
    return 1.0 - eps_clip, 1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher)


def m2po_mask(prox_logprobs, behave_logprobs, loss_mask, *, m2_threshold: float):
    """M2PO's second-moment mask: [B, T] bool, the valid tokens that stay.

    M2_t = (prox_t - behave_t)²; the tokens with the largest M2 are masked, fewest first, until the mean M2 of
    the remaining valid tokens is below `m2_threshold` (all but the smallest one when no suffix gets there), as
    AReaL's `_apply_m2po_masking` / `_get_m2po_loss_mask` over one minibatch. Ties break by position.
    """
    valid = jnp.asarray(loss_mask).astype(bool)
    d = jnp.where(valid, jnp.asarray(prox_logprobs, jnp.float32) - jnp.asarray(behave_logprobs, jnp.float32), 0.0)
    m2 = jnp.where(valid, d * d, -jnp.inf).reshape(-1)
    order = jnp.argsort(-m2, stable=True)                  # largest first, invalid tokens last
    idx = jnp.arange(m2.shape[0])
    n = valid.sum()
    in_valid = idx < n
    sorted_m2 = jnp.where(in_valid, m2[order], 0.0)
    suffix_mean = jnp.cumsum(sorted_m2[::-1])[::-1] / jnp.maximum(n - idx, 1)
    below = in_valid & (suffix_mean < m2_threshold)
    n_masked = jnp.where(below.any(), jnp.argmax(below), jnp.maximum(n - 1, 0))
    masked = jnp.zeros(m2.shape, bool).at[order].set(idx < n_masked).reshape(valid.shape)
    return valid & ~masked


# ------------------------------------------------------------------------- PPO / GSPO / fbc


def sequence_log_ratio(logprobs, base_logprobs, loss_mask, *, mode: str = "mean", segment_ids=None):
    """Per-sequence log ratio: "sum" (exact sequence probability ratio) or "mean" (geometric-mean token
    ratio, GSPO). Returns [num_sequence_slots] float32 (rows of [B, T] when segment_ids is None)."""
    valid = jnp.asarray(loss_mask).astype(bool)
    d = jnp.where(valid, jnp.asarray(logprobs, jnp.float32) - jnp.asarray(base_logprobs, jnp.float32), 0.0)
    total = aggregation.sequence_sum(d, segment_ids)
    if mode == "sum":
        return total
    if mode != "mean":
        raise ValueError(f"sequence log-ratio mode must be 'mean' or 'sum', got {mode!r}")
    return total / jnp.maximum(aggregation.sequence_sum(valid.astype(jnp.float32), segment_ids), 1.0)


def sequence_ratio(logprobs, base_logprobs, loss_mask, *, segment_ids=None):
    """GSPO's sequence ratio exp(mean log ratio) per sequence: token ratios [4, 1] give 2."""
    return jnp.exp(sequence_log_ratio(logprobs, base_logprobs, loss_mask, segment_ids=segment_ids))


_PPO_STATIC = ("eps_clip", "eps_clip_higher", "c_clip", "behav_imp_weight_cap", "rejection", "agg_mode",
               "agg_normalizer", "importance_sampling_level", "filter_positive", "m2_threshold")



def _behaviour_weighted_loss(pg, prox, behave, valid, *, cap, agg_mode, agg_normalizer, rejection=None,
                             segment_ids=None):
    """Paper steps 6-7 for any surrogate pg [B, T]: multiply by the behaviour weight w = exp(prox - behave), drop
    tokens over the cap (they stay in the denominator), aggregate. Returns (loss, (w, kept, dropped, rejected))."""
    w, kept, dropped, rejected = rejection_lib.behaviour_weight(
        prox, behave, valid, cap=cap, rejection=rejection, segment_ids=segment_ids)
    per_token = jnp.where(kept, w * pg, 0.0)
    loss = aggregation.aggregate(per_token, valid, agg_mode, segment_ids=segment_ids, normalizer=agg_normalizer)
    return loss, (w, kept, dropped, rejected)

@functools.partial(jax.jit, static_argnames=_PPO_STATIC)
def _ppo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, segment_ids, keep_mask, *,
              eps_clip, eps_clip_higher, c_clip, behav_imp_weight_cap, rejection, agg_mode, agg_normalizer,
              importance_sampling_level, filter_positive, m2_threshold=None):
    extra = {}
    if filter_positive:  # fbc: only the kept (successful) tokens exist for this loss, denominator included
        keep = (jnp.asarray(advantages) > 0) if keep_mask is None else jnp.asarray(keep_mask).astype(bool)
        loss_mask = jnp.asarray(loss_mask).astype(bool) & keep
    if m2_threshold is not None:   # M2PO: the masked tokens leave the minibatch, denominator included
        full = jnp.asarray(loss_mask).astype(bool)
        loss_mask = m2po_mask(jax.lax.stop_gradient(prox_logprobs), jax.lax.stop_gradient(behave_logprobs), full,
                              m2_threshold=m2_threshold)
        extra["m2po_masked_ratio"] = (full & ~loss_mask).sum() / jnp.maximum(full.sum(), 1)
    lp, prox, behave, adv, valid = _prepare(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    log_ratio = jnp.where(valid, lp - prox, 0.0)
    if importance_sampling_level == "token":
        ratio = jnp.exp(log_ratio)
    else:
        seq_log_ratio = aggregation.sequence_mean(log_ratio, valid, segment_ids)
        if importance_sampling_level == "sequence":        # GSPO: one ratio and one advantage per sequence
            ratio = jnp.exp(seq_log_ratio)
            adv = jnp.where(valid, aggregation.sequence_mean(adv, valid, segment_ids), 0.0)
        else:                                               # GSPO-token: stop-gradient carrier
            carrier = jnp.exp(lp - jax.lax.stop_gradient(lp))
            ratio = jax.lax.stop_gradient(jnp.exp(seq_log_ratio)) * carrier
    pg_unclipped = -adv * ratio
    if eps_clip is None:                                    # no trust-region clip (M2PO's objective)
        clip_mask = jnp.zeros(valid.shape, bool)
        pg = pg_unclipped
    else:
        low, high = _clip_bounds(eps_clip, eps_clip_higher)
        pg_clipped = -adv * jnp.clip(ratio, low, high)
        clip_mask = pg_clipped > pg_unclipped              # the clipped branch is the max
        pg = jnp.where(clip_mask, pg_clipped, pg_unclipped)
    dual_mask = None
    if c_clip is not None:                                  # cap the loss at c·|A| (binds only for A < 0)
        cap_value = c_clip * jnp.abs(adv)
        dual_mask = cap_value < pg
        pg = jnp.where(dual_mask, cap_value, pg)
    loss, (w, kept, dropped, rejected) = _behaviour_weighted_loss(
        pg, prox, behave, valid, cap=behav_imp_weight_cap, agg_mode=agg_mode, agg_normalizer=agg_normalizer,
        rejection=rejection, segment_ids=segment_ids)
    return loss, _stats(loss, lp, prox, behave, valid, ratio, w, kept, dropped, rejected, clip_mask, dual_mask,
                        **extra)


def decoupled_ppo_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, eps_clip=0.2,
                       eps_clip_higher=None, c_clip=None, behav_imp_weight_cap=None, rejection=None,
                       agg_mode="token-mean", agg_normalizer=None, importance_sampling_level="token",
                       segment_ids=None, m2_threshold=None):
    """Clipped (DAPO-asymmetric), dual-clipped, decoupled-IS PPO surrogate with every option.

    pg = max(-A ρ, -A clip(ρ, 1-eps_clip, 1+eps_clip_higher)) (eps_clip=None: pg = -A ρ, no clip); with c_clip:
    pg = min(pg, c·|A|); loss = aggregate(w · pg over kept tokens). `importance_sampling_level`: "token" (PPO),
    "sequence" (GSPO: geometric-mean sequence ratio and sequence-mean advantage) or "sequence-token"
    (GSPO-token). `segment_ids` [B, T] marks packed sequences within a row for sequence-level ops.
    `m2_threshold` (M2PO): first drop the tokens `m2po_mask` masks, out of the denominator too.
    """
    _check_inputs(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, segment_ids)
    check_knobs(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip,
                behav_imp_weight_cap=behav_imp_weight_cap)
    if importance_sampling_level not in ("token", "sequence", "sequence-token"):
        raise ValueError("importance_sampling_level must be 'token', 'sequence' (GSPO) or 'sequence-token' "
                         f"(GSPO-token), got {importance_sampling_level!r}")
    if agg_mode not in aggregation.AGG_MODES:
        raise ValueError(f"unknown agg_mode {agg_mode!r}; choose one of {aggregation.AGG_MODES}")
    check_knobs(m2_threshold=m2_threshold)
    return _ppo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, segment_ids, None,
                     eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip,
                     behav_imp_weight_cap=behav_imp_weight_cap, rejection=_as_rejection(rejection),
                     agg_mode=agg_mode, agg_normalizer=agg_normalizer,
                     importance_sampling_level=importance_sampling_level, filter_positive=False,
                     m2_threshold=None if m2_threshold is None else float(m2_threshold))


def ppo_actor_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, eps_clip=0.2,
                   eps_clip_higher=None, c_clip=None, behav_imp_weight_cap=None):
    """The paper's decoupled loss (steps 5-7), token mean over the whole minibatch.

    Args:
      logprobs: [B, T] current policy log-probs (the only input with a gradient).
      prox_logprobs: [B, T] proximal policy log-probs (ratio anchor).
      behave_logprobs: [B, T] behaviour (rollout) log-probs; pass prox_logprobs for the coupled case.
      advantages: [B, T] per-token advantages.
      loss_mask: [B, T] 1 on policy tokens.
      eps_clip / eps_clip_higher: clip range [1 - eps_clip, 1 + (eps_clip_higher or eps_clip)].
      c_clip: dual clip (> 1) capping the loss at c·|A|, or None.
      behav_imp_weight_cap: drop tokens whose w = exp(prox - behave) exceeds it (None: drop nothing).

    Returns:
      (loss float32 scalar, stats dict of float32 scalars incl. clip_ratio, dual_clip_ratio,
       behave_cap_ratio, approx_kl, behave_approx_kl, importance_weight).
    """
    logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask = segments.as_arrays(
        logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    return decoupled_ppo_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask,
                              eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip,
                              behav_imp_weight_cap=behav_imp_weight_cap)


def fbc_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, success_mask=None,
             eps_clip=0.2, eps_clip_higher=None, c_clip=None, behav_imp_weight_cap=None, rejection=None,
             agg_mode="token-mean", agg_normalizer=None):
    """RAFT++ / filtered BC: the same decoupled surrogate on successful tokens only.

    `success_mask` [B, T] (default: advantages > 0, which the "fbc" estimator gives exactly the successes).
    Failures are filtered out of the minibatch, so they leave the denominator too.
    """
    _check_inputs(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, success_mask)
    check_knobs(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip,
                behav_imp_weight_cap=behav_imp_weight_cap)
    return _ppo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, None, success_mask,
                     eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, c_clip=c_clip,
                     behav_imp_weight_cap=behav_imp_weight_cap, rejection=_as_rejection(rejection),
                     agg_mode=agg_mode, agg_normalizer=agg_normalizer, importance_sampling_level="token",
                     filter_positive=True)


# --------------------------------------------------------------------------- SAPO, CISPO, SAO


@functools.partial(jax.jit, static_argnames=("tau_pos", "tau_neg", "behav_imp_weight_cap", "agg_mode",
                                             "agg_normalizer"))
def _sapo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, tau_pos, tau_neg,
               behav_imp_weight_cap, agg_mode, agg_normalizer):
    lp, prox, behave, adv, valid = _prepare(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    ratio = jnp.exp(jnp.where(valid, lp - prox, 0.0))
    tau = jnp.where(adv > 0, tau_pos, tau_neg)
    p = jax.nn.sigmoid(tau * (ratio - 1.0))
    pg = -(4.0 / tau) * p * adv
    loss, (w, kept, dropped, rejected) = _behaviour_weighted_loss(
        pg, prox, behave, valid, cap=behav_imp_weight_cap, agg_mode=agg_mode, agg_normalizer=agg_normalizer)
    gate = jax.lax.stop_gradient(4.0 * p * (1.0 - p))
    return loss, _stats(loss, lp, prox, behave, valid, ratio, w, kept, dropped, rejected,
                        sapo_gate=jnp.where(valid, gate, 0.0).sum() / jnp.maximum(valid.sum(), 1))


def sapo_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, tau_pos=1.0, tau_neg=1.05,
              behav_imp_weight_cap=None, agg_mode="token-mean", agg_normalizer=None):
    """SAPO: soft gate (4/τ)·σ(τ(ρ-1))·A instead of the hard clip; τ by the sign of A.

    Its gradient gate 4σ(1-σ) is exactly 1 at ρ = 1; a larger τ_neg damps negative updates faster.
    The ratio is against prox (SAPO is meant coupled: pass behave = prox; the weight is then 1).
    """
    _check_inputs(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    check_knobs(tau_pos=tau_pos, tau_neg=tau_neg, behav_imp_weight_cap=behav_imp_weight_cap)
    return _sapo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, tau_pos=tau_pos,
                      tau_neg=tau_neg, behav_imp_weight_cap=behav_imp_weight_cap, agg_mode=agg_mode,
                      agg_normalizer=agg_normalizer)


@functools.partial(jax.jit, static_argnames=("eps_clip", "eps_clip_higher", "behav_imp_weight_cap", "agg_mode",
                                             "agg_normalizer"))
def _cispo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, eps_clip, eps_clip_higher,
                behav_imp_weight_cap, agg_mode, agg_normalizer):
    lp, prox, behave, adv, valid = _prepare(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    ratio = jnp.exp(jnp.where(valid, lp - prox, 0.0))
    low = 0.0 if eps_clip is None else 1.0 - eps_clip
    clipped = jnp.clip(ratio, low, 1.0 + eps_clip_higher)
    pg = -jax.lax.stop_gradient(clipped) * adv * lp
    loss, (w, kept, dropped, rejected) = _behaviour_weighted_loss(
        pg, prox, behave, valid, cap=behav_imp_weight_cap, agg_mode=agg_mode, agg_normalizer=agg_normalizer)
    return loss, _stats(loss, lp, prox, behave, valid, ratio, w, kept, dropped, rejected,
                        clip_mask=jax.lax.stop_gradient(clipped != ratio))


def cispo_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, eps_clip=None,
               eps_clip_higher=0.28, behav_imp_weight_cap=None, agg_mode="token-mean", agg_normalizer=None):
    """CISPO: -sg(clip(ρ, 1-eps_clip, 1+eps_clip_higher)) · A · logπ; every token keeps its gradient.
    eps_clip=None leaves the ratio unbounded below (the CISPO default)."""
    _check_inputs(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    if eps_clip_higher is None or not eps_clip_higher > 0:
        raise ValueError(f"CISPO needs eps_clip_higher > 0, got {eps_clip_higher}")
    check_knobs(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher, behav_imp_weight_cap=behav_imp_weight_cap)
    return _cispo_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, eps_clip=eps_clip,
                       eps_clip_higher=eps_clip_higher, behav_imp_weight_cap=behav_imp_weight_cap,
                       agg_mode=agg_mode, agg_normalizer=agg_normalizer)


@functools.partial(jax.jit, static_argnames=("eps_clip", "eps_clip_higher", "detach_ratio", "agg_mode",
                                             "agg_normalizer"))
def _sao_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, eps_clip, eps_clip_higher,
              detach_ratio, agg_mode, agg_normalizer):
    lp, prox, behave, adv, valid = _prepare(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    ratio = jnp.exp(jnp.where(valid, lp - behave, 0.0))
    trusted = (ratio > 1.0 - eps_clip) & (ratio < 1.0 + eps_clip_higher)  # strict open interval
    f = jnp.where(trusted, ratio, 0.0)
    if detach_ratio:
        f = jax.lax.stop_gradient(f)
    per_token = jnp.where(valid, -f * adv * lp, 0.0)
    loss = aggregation.aggregate(per_token, valid, agg_mode, normalizer=agg_normalizer)
    ones = jnp.ones(valid.shape, jnp.float32)
    return loss, _stats(loss, lp, prox, behave, valid, ratio, ones, valid & trusted, jnp.zeros_like(valid),
                        valid & ~trusted)


def sao_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, eps_clip=0.2,
             eps_clip_higher=0.2, detach_ratio=True, agg_mode="token-mean", agg_normalizer=None):
    """SAO direct double-sided IS against the *behaviour* policy: f(r) = r inside (1-εl, 1+εh), else 0;
    loss = -mean(f(r)·A·logπ). Rejected tokens stay in the denominator (logged as rejection_ratio).
    `detach_ratio` (default) treats f(r) as a constant weight; False is the literal-autograd reading.
    The proximal log-probs only feed the KL statistics."""
    _check_inputs(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask)
    check_knobs(eps_clip=eps_clip, eps_clip_higher=eps_clip_higher)
    return _sao_impl(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, eps_clip=eps_clip,
                     eps_clip_higher=eps_clip_higher, detach_ratio=bool(detach_ratio), agg_mode=agg_mode,
                     agg_normalizer=agg_normalizer)


# ----------------------------------------------------------------------------------- registry

_GSPO = dict(eps_clip=3e-4, eps_clip_higher=4e-4, agg_mode="seq-mean-token-mean")

_REGISTRY = {
    "ppo": (decoupled_ppo_loss, {}),
    "grpo": (decoupled_ppo_loss, {}),
    "dapo": (decoupled_ppo_loss, {"eps_clip_higher": 0.28}),
    "drgrpo": (decoupled_ppo_loss, {"agg_mode": "seq-mean-token-sum-norm"}),
    "icepop": (decoupled_ppo_loss, {"rejection": rejection_lib.icepop()}),
    "kpop": (decoupled_ppo_loss, {"rejection": rejection_lib.kpop()}),
    # GSPO: clip the geometric-mean sequence ratio (tight clip); every sequence has equal outer weight
    "gspo": (decoupled_ppo_loss, dict(_GSPO, importance_sampling_level="sequence")),
    # GSPO-token: ratio_t = sg(s_i)·exp(lp_t - sg(lp_t)), so token advantages keep local credit
    "gspo_token": (decoupled_ppo_loss, dict(_GSPO, importance_sampling_level="sequence-token")),
    # M2PO: no trust-region clip; the second-moment mask bounds the behaviour gap instead (AReaL's example: 0.04)
    "m2po": (decoupled_ppo_loss, {"eps_clip": None, "m2_threshold": 0.04}),
    "sapo": (sapo_loss, {}),
    "cispo": (cispo_loss, {}),
    "sao": (sao_loss, {}),
    "fbc": (fbc_loss, {}),
    "raft": (fbc_loss, {}),
}


_LOSS_INPUTS = ("logprobs", "prox_logprobs", "behave_logprobs", "advantages", "loss_mask")


def register_loss(name: str, fn, **defaults) -> None:
    """Make `name` an actor loss every recipe can name (`actor.loss`), with `defaults` bound (a recipe's values).

    fn(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, knob=default, ...) -> (loss, stats):
    [B, T] inputs as in the module docstring, a float32 scalar loss and a dict of float32 scalar stats (the
    trainer logs every stat; `clip_ratio`, `dual_clip_ratio` and `behave_cap_ratio` go to the dashboard). Knobs
    are keyword-only; a run config sets one from `actor.<knob>` when such a field exists and is not None
    (`jaxwebrl.train.rl_config.loss_kwargs`). Registering the same loss again is a no-op; another one under a
    taken name is a ValueError.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"loss name must be a non-empty str, got {name!r}")
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise TypeError(f"register_loss({name!r}, ...): the loss must be a Python function") from None
    positional = [p.name for p in parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != len(_LOSS_INPUTS):
        raise ValueError(f"register_loss({name!r}, ...): the loss takes {len(_LOSS_INPUTS)} positional inputs "
                         f"{_LOSS_INPUTS}, got {positional}")
    knobs = {p.name for p in parameters.values() if p.kind == p.KEYWORD_ONLY}
    unknown = sorted(set(defaults) - knobs)
    if unknown:
        raise ValueError(f"register_loss({name!r}, ...): defaults {unknown} are not keyword-only arguments of the "
                         f"loss (it takes {sorted(knobs)})")
    entry = (fn, dict(defaults))
    if _REGISTRY.get(name, entry) != entry:
        raise ValueError(f"loss {name!r} is already registered: choose another name")
    _REGISTRY[name] = entry


def loss_names():
    return sorted(_REGISTRY)


def get_loss(name: str):
    """Loss by name: f(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, **kw) -> (loss, stats).
    The recipe's defaults are bound; keyword arguments override them."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown loss {name!r}; choose one of {loss_names()}")
    fn, defaults = _REGISTRY[name]
    return functools.partial(fn, **defaults) if defaults else fn


def loss_default(name: str, kwarg: str):
    """The value keyword `kwarg` takes in loss `name` when not passed (the recipe's binding, else the function's)."""
    get_loss(name)
    fn, defaults = _REGISTRY[name]
    if kwarg in defaults:
        return defaults[kwarg]
    parameter = inspect.signature(fn).parameters.get(kwarg)
    if parameter is None:
        raise ValueError(f"loss {name!r} takes no {kwarg!r}")
    return parameter.default


def loss_kwarg_names(name: str) -> frozenset:
    """The keyword arguments loss `name` accepts (to filter a config's knobs)."""
    get_loss(name)
    fn, _ = _REGISTRY[name]
    return frozenset(p.name for p in inspect.signature(fn).parameters.values() if p.kind == p.KEYWORD_ONLY)
