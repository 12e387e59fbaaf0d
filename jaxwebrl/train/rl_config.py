"""Translate a run's config into the objects that train on it: the advantage path and the loss (`config.actor`),
the update step's settings and the optimizer's (`update_settings`, `optimizer_settings`), and critic PPO's value
model (`config.critic`: `value_model`). Every translation of config fields into objects lives here.

A recipe names its advantage estimator (`actor.estimator`: "grpo", "drgrpo", "rloo", "success_filter", ..., the
jaxwebrl.rl registry), as AReaL and Tunix users do; the reward normalisation is still written the way the paper
and AReaL write it (`reward_norm.mean_level/std_level`, `mean_leave1out`), and must be the one the estimator
implies (the registry records it), so an override of one without the other fails before the run starts.

Loss knobs: `LOSS_KNOBS` maps the built-in `actor.*` fields onto the keyword arguments of the registered losses
that take them; any other keyword-only argument of a registered loss (an extension's) is set from the `actor`
field of the same name when the config has one and it is not None.
"""

from __future__ import annotations

import dataclasses
import json

from ml_collections import config_dict

from jaxwebrl.rl import advantages, estimators, losses
from jaxwebrl.rl.normalization import NormConfig
from jaxwebrl.train.critic import CriticSettings, ValueModel
from jaxwebrl.train.update import OptimizerConfig, UpdateSettings

def _levels(levels) -> str:
    mean, std, leave1out = levels
    return f"mean_level={mean!r}, std_level={std!r}, mean_leave1out={leave1out}"


def estimator_name(actor: config_dict.ConfigDict) -> str:
    """`actor.estimator`, checked against the reward normalisation it implies (`estimators.register_estimator`
    records it); ValueError, one line, otherwise."""
    name = actor.estimator
    names = estimators.estimator_names()
    if name not in names:
        raise ValueError(f"actor.estimator={name!r} is not an advantage estimator: use one of {names} (or register "
                         f"one: jaxwebrl.rl.estimators.register_estimator)")
    norm = actor.reward_norm
    levels = (norm.mean_level, norm.std_level, bool(norm.mean_leave1out))
    implied = estimators.implied_reward_norm(name)
    if levels != implied:
        match = [n for n in names if estimators.implied_reward_norm(n) == levels]
        hint = f" (those levels are estimator {', '.join(map(repr, match))})" if match else ""
        raise ValueError(f"actor.estimator={name!r} implies reward_norm {_levels(implied)} but the config has "
                         f"{_levels(levels)}{hint}: change one to match the other")
    return name


def lambda_kwargs(actor: config_dict.ConfigDict) -> tuple:
    """`actor.gae_lambda_kwargs` (a JSON object, '' for none) as sorted (name, value) pairs; ValueError otherwise."""
    text = actor.gae_lambda_kwargs
    try:
        kwargs = json.loads(text) if text else {}
    except json.JSONDecodeError:
        kwargs = None
    if not isinstance(kwargs, dict):
        raise ValueError(f"gae_lambda_kwargs={text!r}: give a JSON object, e.g. '{{\"alpha\": 0.05}}', or '' for none")
    return tuple(sorted(kwargs.items()))


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
        gae_lambda=actor.gae_lambda_fn if actor.gae_lambda_fn is not None else float(actor.gae_lambda),
        gae_lambda_kwargs=lambda_kwargs(actor),
        gae_timestep_unit=actor.gae_timestep_unit,
        max_turns=actor.max_turns,
        kl_ctl=float(actor.kl_ctl),
        kl_estimator=actor.kl_estimator,
        adv_norm=adv_norm,
    )


# actor.<field> -> keyword of the registered losses that accept it (None values keep the loss's own default).
LOSS_KNOBS = {"eps_clip": "eps_clip", "eps_clip_higher": "eps_clip_higher", "c_clip": "c_clip",
              "behav_imp_weight_cap": "behav_imp_weight_cap", "agg_mode": "agg_mode",
              "sapo_tau_pos": "tau_pos", "sapo_tau_neg": "tau_neg", "m2_threshold": "m2_threshold"}
CONSTANT_NORMALIZER_MODE = "seq-mean-token-sum-norm"


def agg_mode(actor: config_dict.ConfigDict) -> str | None:
    """The aggregation the loss will use: actor.agg_mode, else the registered loss's own (None if it has none)."""
    if actor.agg_mode is not None:
        return actor.agg_mode
    if "agg_mode" not in losses.loss_kwarg_names(actor.loss):
        return None
    return losses.loss_default(actor.loss, "agg_mode")


def loss_kwargs(actor: config_dict.ConfigDict, *, max_new_tokens: int) -> tuple:
    """(name, value) pairs for `losses.get_loss(actor.loss)`: every set knob the loss accepts (hashable).
    Dr.GRPO's constant normaliser (seq-mean-token-sum-norm) is `actor.agg_normalizer`, by default the response-token
    budget `max_new_tokens` (the Dr.GRPO paper's constant): never the padded row width."""
    accepted = losses.loss_kwarg_names(actor.loss)
    out = []
    for field, kwarg in LOSS_KNOBS.items():
        value = actor[field]
        if kwarg in accepted and value is not None:
            out.append((kwarg, value))
    built_in = set(LOSS_KNOBS.values()) | {"agg_normalizer"}
    for kwarg in sorted(accepted - built_in):   # an extension loss's own knobs: actor.<same name>
        if kwarg in actor and actor[kwarg] is not None:
            out.append((kwarg, actor[kwarg]))
    if agg_mode(actor) == CONSTANT_NORMALIZER_MODE:
        normalizer = actor.agg_normalizer if actor.agg_normalizer is not None else max_new_tokens
        out.append(("agg_normalizer", float(normalizer)))
    return tuple(out)


def ignored_knobs(actor: config_dict.ConfigDict) -> list[str]:
    """Set knobs the configured loss does not take (a recipe mistake worth refusing)."""
    accepted = losses.loss_kwarg_names(actor.loss)
    ignored = [f for f, kwarg in LOSS_KNOBS.items()
               if actor[f] is not None and kwarg not in accepted and f not in ("eps_clip", "agg_mode")]
    if actor.agg_normalizer is not None and agg_mode(actor) != CONSTANT_NORMALIZER_MODE:
        ignored.append("agg_normalizer")
    return ignored


def optimizer_settings(config: config_dict.ConfigDict) -> OptimizerConfig:
    """The run's AdamW settings (`config.train`)."""
    t = config.train
    return OptimizerConfig(
        lr=t.lr, total_steps=t.max_steps, schedule=t.lr_schedule, warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay, b1=t.adam_b1, b2=t.adam_b2, eps=t.adam_eps, max_grad_norm=t.max_grad_norm,
        updates_per_step=t.ppo_n_minibatches * t.ppo_n_epochs, moments_dtype=t.moments_dtype)


def update_settings(config: config_dict.ConfigDict) -> UpdateSettings:
    """The run's update step settings (`config.train`, `config.actor`; the sampling transform of `config.model`,
    which the log-probs replay)."""
    t, a, m = config.train, config.actor, config.model
    return UpdateSettings(
        loss=a.loss, loss_kwargs=loss_kwargs(a, max_new_tokens=m.max_new_tokens),
        use_decoupled_loss=a.use_decoupled_loss, n_minibatches=t.ppo_n_minibatches, n_epochs=t.ppo_n_epochs,
        temperature=m.temperature, top_k=m.top_k, top_p=m.top_p,
        advantage=advantage_config(a, max_new_tokens=m.max_new_tokens),
        kl_loss_coef=float(a.kl_loss_coef), kl_loss_estimator=a.kl_loss_estimator,
        skip_non_finite=bool(t.rollback_non_finite), length_groups=int(t.length_groups),
        length_layouts=int(t.length_layouts))


def critic_optimizer_settings(config: config_dict.ConfigDict) -> OptimizerConfig:
    """The critic's AdamW: the policy's settings (`optimizer_settings`) with its own learning rate `critic.lr`."""
    return dataclasses.replace(optimizer_settings(config), lr=config.critic.lr)


def value_model(config: config_dict.ConfigDict, policy) -> ValueModel | None:
    """Critic PPO's value model on `policy`'s trunk (`config.critic.enabled`), or None; its `state` is set by the
    trainer (a fresh one or the checkpoint's)."""
    c = config.critic
    if not c.enabled:
        return None
    settings = CriticSettings(value_eps_clip=c.value_eps_clip, value_loss_coef=float(c.value_loss_coef),
                              turn_unit=config.actor.gae_timestep_unit == "turn")
    return ValueModel(policy.module, policy.config, settings, critic_optimizer_settings(config))


def max_offpolicyness(config) -> int:
    """η the gatherer enforces: `rollout.max_head_offpolicyness` in asynchronous mode, 0 in synchronous mode, whose
    baseline is strictly on-policy (an episode still in flight when the weights changed, or left over from the
    round before, is dropped as stale and counted, never trained)."""
    return 0 if config.rollout.mode == "sync" else int(config.rollout.max_head_offpolicyness)
