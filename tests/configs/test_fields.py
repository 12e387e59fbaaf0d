"""Every config field is declared once (configs/base.py SCHEMA): its default, one line of help and its check, and
the rules another layer owns (the losses' knobs) are the very rules validation applies."""

import importlib

import numpy as np
import pytest
from ml_collections import config_dict

from configs import base, fields
from jaxwebrl.rl import losses
from jaxwebrl.train import rl_config, run_config
from jaxwebrl.train.config_validation import ConfigError, validate
from tests.configs.test_recipes import RECIPES, load


def test_every_field_of_every_recipe_is_declared_with_one_line_of_help():
    declared = set(base.FIELDS)
    assert set(run_config.flat(run_config.as_dict(base.config()))) == declared
    for key, field in base.FIELDS.items():
        assert field.help.strip() and "\n" not in field.help, key
    for name in RECIPES:   # recipes set declared fields only (an extension's own knob is its recipe's business)
        assert set(run_config.flat(run_config.as_dict(load(name)[1]))) == declared, name


def test_the_declared_default_is_the_built_value_and_none_able_fields_stay_typed():
    c = base.config()
    for key, field in base.FIELDS.items():
        node = c
        for part in key.split("."):
            node = node[part]
        assert node == field.default, key
        assert field.problem(field.default) is None, key   # every default passes its own check
    # the dual clip defaults to 3.0 yet may be None, and stays a float (one declaration, no double assignment)
    c.actor.c_clip = None
    c.actor.c_clip = 2
    assert isinstance(c.actor.c_clip, float)
    with pytest.raises(TypeError):
        c.actor.c_clip = "3"


def test_field_helper_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="needs type="):
        fields.Field(None, "no type")
    with pytest.raises(ValueError, match="one line of help"):
        fields.Field(1, " ")
    schema = {"s": {"n": fields.Field(2, "a count", fields.at_least(1)), "x": fields.Field(None, "opt", type=float)}}
    built, flat = fields.build(schema), fields.flatten(schema)
    assert built.s.n == 2 and built.s.x is None and set(flat) == {"s.n", "s.x"}
    assert isinstance(built.s._fields["x"], config_dict.FieldReference)
    assert flat["s.n"].problem(0) == "must be >= 1" and flat["s.n"].problem(1) is None
    assert flat["s.x"].problem(None) is None


@pytest.mark.parametrize("key, value, message", [
    ("train.max_steps", 0, r"^train\.max_steps=0: must be >= 1$"),
    ("env.step_timeout_s", 0.0, r"^env\.step_timeout_s=0\.0: must be > 0 seconds$"),
    ("buffer.max_seq_len", 0, r"^buffer\.max_seq_len=0: must be >= 1$"),
    ("actor.gae_lambda", 1.5, r"^actor\.gae_lambda=1\.5: need 0 <= gae_lambda <= 1$"),
    ("metrics.sample_episodes_every", -1, r"^metrics\.sample_episodes_every=-1: must be an int >= 0"),
    ("distributed.mesh.fsdp", 0, r"^distributed\.mesh\.fsdp=0: must be a positive size or -1"),
    ("actor.reward_norm.eps", 0.0, r"^actor\.reward_norm\.eps=0\.0: must be > 0"),
    ("train.adam_b2", 1.0, r"^train\.adam_b2=1\.0: must be in \[0, 1\)"),
    ("train.adam_eps", 0.0, r"^train\.adam_eps=0\.0: must be > 0"),
    ("train.weight_decay", -0.1, r"^train\.weight_decay=-0\.1: must be >= 0"),
    ("train.idle_sleep_s", 0.0, r"^train\.idle_sleep_s=0\.0: must be > 0"),
    ("rollout.ray_cpus_per_worker", 0.0, r"^rollout\.ray_cpus_per_worker=0\.0: must be > 0"),
])
def test_declared_checks_run_at_validation(key, value, message, tmp_path):
    _, c = load("constT10", "toy")
    *parents, leaf = key.split(".")
    node = c
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(ConfigError, match=message):
        validate(c, str(tmp_path))


def _set(c, key, value):
    *parents, leaf = key.split(".")
    node = c
    for part in parents:
        node = node[part]
    node[leaf] = value


def test_every_numeric_field_declares_its_range_or_why_it_has_none():
    """A number field carries its check, names the rule of the layer that owns its range (an importable one), or
    says why any value is allowed: a field added without one fails here."""
    bare = [key for key, field in base.FIELDS.items()
            if field.numeric and field.check is None and field.checked_by is None and not field.any_value]
    assert not bare, f"numeric fields with no declared range: {bare}: give each a check (configs/fields.py), the " \
                     f"rule that owns it (checked_by=) or why any value is allowed (any_value=)"
    for key, field in base.FIELDS.items():
        if field.checked_by is not None:
            module, _, name = field.checked_by.rpartition(".")
            assert hasattr(importlib.import_module(module), name), f"{key}: checked_by {field.checked_by} is no rule"


# A value out of range for every field whose range another layer owns (checked_by), with the fields it needs set
# to reach that rule: validation must refuse each in one line naming the key.
OWNED_RANGE_CASES = {
    "model.num_layers": (0, {"model.name": "random", "model.preset": "qwen3vl_2b"}),
    "model.vision_depth": (0, {"model.name": "random", "model.preset": "qwen3vl_2b"}),
    "model.remat": ("dots", {}),
    "env.max_episode_steps": (1001, {}),
    "env.latency.page_delay_median_s": (-0.5, {}),
    "env.latency.page_delay_p95_s": (0.1, {}),
    "env.latency.page_delay_max_s": (1.0, {}),
    "env.latency.network_latency_ms": (-1.0, {}),
    "env.latency.download_kbps": (float("nan"), {}),
    "env.latency.upload_kbps": (-1.0, {}),
    "train.lr_schedule": ("linear", {}),
    "actor.eps_clip": (1.0, {}),
    "actor.eps_clip_higher": (-0.1, {}),
    "actor.c_clip": (1.0, {}),
    "actor.behav_imp_weight_cap": (1.0, {}),
    "actor.m2_threshold": (0.0, {"actor.loss": "m2po"}),
    "actor.sapo_tau_pos": (0.0, {"actor.loss": "sapo", "actor.use_decoupled_loss": False}),
    "actor.sapo_tau_neg": (-1.0, {"actor.loss": "sapo", "actor.use_decoupled_loss": False}),
    "actor.kl_estimator": ("k4", {}),
    "actor.kl_loss_estimator": ("k0", {}),
    "actor.step_adv_const_length": (0.0, {}),
    "actor.overlong_tokens": (0, {"actor.overlong_penalty_factor": 1.0}),
    "actor.overlong_penalty_factor": (0.0, {"actor.overlong_tokens": 8}),
    "distributed.num_processes": (0, {}),
    "distributed.process_id": (2, {"distributed.num_processes": 2, "distributed.coordinator_address": "h:1"}),
    "distributed.local_device_count": (0, {}),
}


def test_every_owned_range_has_a_refused_case():
    owned = {key for key, field in base.FIELDS.items() if field.checked_by is not None}
    assert owned == set(OWNED_RANGE_CASES), f"add a refused value for {sorted(owned - set(OWNED_RANGE_CASES))}"


@pytest.mark.parametrize("key", OWNED_RANGE_CASES)
def test_validation_refuses_each_owned_range_in_one_line_naming_the_key(key, tmp_path):
    bad, needs = OWNED_RANGE_CASES[key]
    _, c = load("constT10", "toy")
    c.env.latency.regime = "web"          # the latency ranges hold in either regime; "web" is the one that reads them
    c.env.step_timeout_s = 60.0
    for other, value in needs.items():
        _set(c, other, value)
    _set(c, key, bad)
    with pytest.raises(ConfigError) as err:
        validate(c, str(tmp_path))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{key}="), line


def _loss_inputs():
    lp = np.log(np.full((1, 3), 0.5, np.float32))
    return lp, lp, lp, np.ones((1, 3), np.float32), np.ones((1, 3), np.float32)


@pytest.mark.parametrize("cap", [1.0, 0.5, 0.0])
def test_behaviour_weight_cap_has_one_rule_in_rl_and_in_validation(cap, tmp_path):
    """w = exp(prox − behave) is 1 on-policy, so a cap <= 1 would drop on-policy tokens: both refuse it, with the
    same words."""
    fragment = "the behaviour-weight cap must be > 1"
    with pytest.raises(ValueError, match=f"^behav_imp_weight_cap={cap!r}: {fragment}"):
        losses.ppo_actor_loss(*_loss_inputs(), behav_imp_weight_cap=cap)
    _, c = load("constT10", "toy")
    c.actor.behav_imp_weight_cap = cap
    with pytest.raises(ConfigError, match=f"^actor\\.behav_imp_weight_cap={cap!r}: {fragment}"):
        validate(c, str(tmp_path))
    losses.ppo_actor_loss(*_loss_inputs(), behav_imp_weight_cap=1.5)   # just above 1: allowed by both
    c.actor.behav_imp_weight_cap = 1.5
    validate(c, str(tmp_path))


@pytest.mark.parametrize("field, recipe, bad", [
    ("eps_clip", "constT10", 1.0), ("eps_clip_higher", "dapo", -0.1), ("c_clip", "constT10", 1.0),
    ("m2_threshold", "m2po", 0.0), ("sapo_tau_pos", "sapo", 0.0), ("sapo_tau_neg", "sapo", -1.0),
])
def test_every_loss_knob_is_refused_by_validation_with_the_losses_own_words(field, recipe, bad, tmp_path):
    kwarg = rl_config.LOSS_KNOBS[field]
    fix = losses.knob_problem(kwarg, bad)
    assert fix is not None
    _, c = load(recipe, "toy")
    c.actor[field] = bad
    with pytest.raises(ConfigError) as err:
        validate(c, str(tmp_path))
    assert str(err.value) == f"actor.{field}={bad!r}: {fix}"
    loss = losses.get_loss(c.actor.loss)
    with pytest.raises(ValueError) as err:
        loss(*_loss_inputs(), **{kwarg: bad})
    assert str(err.value) == f"{kwarg}={bad!r}: {fix}"
