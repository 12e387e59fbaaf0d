"""Every config field is declared once (configs/base.py SCHEMA): its default, one line of help and its check, and
the rules another layer owns (the losses' knobs) are the very rules validation applies."""

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


def test_the_configs_copy_of_a_library_list_is_the_librarys():
    """configs/ imports nothing from jaxwebrl, so a choice list it checks against is a copy: it must stay equal to the
    library's own (one rule, two spellings of it)."""
    from configs import base
    from jaxwebrl.rl import kl

    assert base.KL_ESTIMATORS == kl.KL_ESTIMATORS
