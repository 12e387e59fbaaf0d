"""Translate a run's `config.actor` into the jaxwebrl.rl objects: the advantage path and the loss.

The reward normalisation is written the way the paper and AReaL write it (`reward_norm.mean_level/std_level`,
`mean_leave1out`); jaxwebrl.rl names the same estimators (GRPO, Dr.GRPO, RLOO, ...). This module is the one
place that maps one onto the other.
"""

from __future__ import annotations

from ml_collections import config_dict

from jaxwebrl.rl import advantages, losses
from jaxwebrl.rl.normalization import NormConfig

# (mean_level, std_level, mean_leave1out) of actor.reward_norm -> jaxwebrl.rl advantage estimator.
ESTIMATOR_BY_NORM = {
    ("group", "group", False): "grpo",
    ("group", None, False): "drgrpo",
    ("group", None, True): "rloo",
    ("group", "batch", False): "liteppo",
    ("batch", "batch", False): "batch",
    (None, None, False): "raw",
}


def estimator_name(actor: config_dict.ConfigDict) -> str:
    """The advantage estimator `actor` asks for; RAFT++'s success filter overrides the reward norm."""
    if actor.success_filter:
        return "fbc"
    norm = actor.reward_norm
    key = (norm.mean_level, norm.std_level, bool(norm.mean_leave1out))
    if key not in ESTIMATOR_BY_NORM:
        supported = ", ".join(f"{m}/{s}{' leave-one-out' if l else ''}" for m, s, l in ESTIMATOR_BY_NORM)
        raise ValueError(f"reward_norm mean_level/std_level={key[0]}/{key[1]} (leave1out={key[2]}) has no "
                         f"estimator; use one of {supported}")
    return ESTIMATOR_BY_NORM[key]


def advantage_config(actor: config_dict.ConfigDict, *, max_new_tokens: int) -> advantages.AdvantageConfig:
    """The hashable AdvantageConfig for `actor` (pass it as a static argument under jit)."""
    adv = actor.adv_norm
    adv_norm = None
    if adv.mean_level is not None or adv.std_level is not None:
        adv_norm = NormConfig(mean_level=adv.mean_level, std_level=adv.std_level, mean_leave1out=adv.mean_leave1out,
                              std_unbiased=adv.std_unbiased, eps=adv.eps)
    overlong = actor.overlong_tokens
    return advantages.AdvantageConfig(
        estimator=estimator_name(actor),
        std_unbiased=bool(actor.reward_norm.std_unbiased),
        eps=float(actor.reward_norm.eps),
        reward_bias=float(actor.reward_bias),
        reward_scaling=float(actor.reward_scaling),
        reward_clip=actor.reward_clip,
        overlong_tokens=overlong,
        overlong_penalty_factor=actor.overlong_penalty_factor if overlong is not None else None,
        max_response_tokens=max_new_tokens if overlong is not None else None,
        step_adv_const_length=actor.step_adv_const_length,
        discount=float(actor.discount),
        gae_lambda=float(actor.gae_lambda),
        kl_ctl=float(actor.kl_ctl),
        adv_norm=adv_norm,
    )


# actor.<field> -> keyword of the registered losses that accept it (None values keep the loss's own default).
LOSS_KNOBS = {"eps_clip": "eps_clip", "eps_clip_higher": "eps_clip_higher", "c_clip": "c_clip",
              "behav_imp_weight_cap": "behav_imp_weight_cap", "agg_mode": "agg_mode",
              "sapo_tau_pos": "tau_pos", "sapo_tau_neg": "tau_neg"}


def loss_kwargs(actor: config_dict.ConfigDict) -> tuple:
    """(name, value) pairs for `losses.get_loss(actor.loss)`: every set knob the loss accepts (hashable)."""
    accepted = losses.loss_kwarg_names(actor.loss)
    out = []
    for field, kwarg in LOSS_KNOBS.items():
        value = actor[field]
        if kwarg in accepted and value is not None:
            out.append((kwarg, value))
    return tuple(out)


def ignored_knobs(actor: config_dict.ConfigDict) -> list[str]:
    """Set knobs the configured loss does not take (a recipe mistake worth refusing)."""
    accepted = losses.loss_kwarg_names(actor.loss)
    return [f for f, kwarg in LOSS_KNOBS.items()
            if actor[f] is not None and kwarg not in accepted and f not in ("eps_clip", "agg_mode")]
