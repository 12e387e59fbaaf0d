"""Critic PPO's config: configs/ppo.py's recipe, and every combination that cannot run refused in one line by
validation (launch/train.py runs it before any process, buffer or browser starts)."""

import os
import subprocess
import sys

import pytest

from configs.ppo import get_config
from jaxwebrl.rl import estimators
from jaxwebrl.train import rl_config
from jaxwebrl.train.config_validation import ConfigError, validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_ppo_recipe_is_critic_ppo():
    c = get_config("qwen3vl_8b")
    assert (c.actor.estimator, c.actor.loss, c.critic.enabled, c.critic.value_eps_clip) == ("gae", "ppo", True, 0.2)
    assert (c.actor.reward_norm.mean_level, c.actor.reward_norm.std_level) == (None, None)   # no group norm
    assert (c.actor.adv_norm.mean_level, c.actor.adv_norm.std_level) == ("batch", "batch")
    assert c.critic.lr == c.train.lr == 5e-6
    assert estimators.critic_use("gae") == "needed" and estimators.critic_use("grpo") == "ignored"
    adv = rl_config.advantage_config(c.actor, max_new_tokens=c.model.max_new_tokens)
    assert (adv.estimator, adv.gae_timestep_unit, adv.max_turns, adv.gae_lambda) == ("gae", "token", 1, 1.0)


def _toy(**overrides):
    c = get_config("toy")
    for key, value in overrides.items():
        node = c
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    return c


def test_the_toy_variant_validates(tmp_path):
    validate(_toy(), str(tmp_path))
    validate(_toy(**{"actor.gae_timestep_unit": "turn", "actor.gae_lambda_fn": "relative_position",
                     "actor.gae_lambda_kwargs": '{"q": 0.5}'}), str(tmp_path))


@pytest.mark.parametrize("overrides, message", [
    ({"critic.enabled": False}, r"^actor\.estimator='gae': GAE from critic values needs a value model: set "
                                r"--config\.critic\.enabled=True"),
    ({"actor.estimator": "grpo", "actor.reward_norm.mean_level": "group", "actor.reward_norm.std_level": "group"},
     r"^critic\.enabled=True: actor\.estimator='grpo' has its own baseline and ignores values"),
    ({"actor.estimator": "success_filter", "actor.loss": "raft"}, r"^critic\.enabled=True: actor\.estimator="),
    ({"actor.loss": "fbc"}, r"^critic\.enabled=True: actor\.loss='fbc' keeps successes by sign and ignores values"),
    ({"actor.gae_timestep_unit": "step"}, r"^actor\.gae_timestep_unit='step': use 'token' or 'turn'$"),
    ({"actor.max_turns": 0}, r"^actor\.max_turns=0: must be >= 1"),
    ({"actor.gae_lambda_fn": "nope"}, r"^actor\.gae_lambda_fn='nope': use one of \['relative_position', "),
    ({"actor.gae_lambda_fn": "vapo_length_adaptive", "actor.gae_lambda_kwargs": "alpha=1"},
     r"^actor\.gae_lambda_kwargs='alpha=1': give a JSON object"),
    ({"actor.gae_lambda_fn": "vapo_length_adaptive", "actor.gae_lambda_kwargs": '{"alpha": 0}'},
     r"^actor\.gae_lambda_kwargs=.*vapo_length_adaptive: vapo_length_adaptive needs alpha > 0"),
    ({"actor.gae_lambda_fn": "relative_position", "actor.gae_lambda_kwargs": '{"alpha": 1}'},
     r"^actor\.gae_lambda_kwargs=.*relative_position: .*unexpected keyword argument 'alpha'"),
    ({"actor.gae_lambda_kwargs": '{"q": 0.5}'}, r"^actor\.gae_lambda_kwargs=.*set actor\.gae_lambda_fn too"),
    ({"critic.value_eps_clip": 0.0}, r"^critic\.value_eps_clip=0\.0: must be > 0"),
    ({"critic.lr": 0.0}, r"^critic\.lr=0\.0: the critic's learning rate must be > 0"),
    ({"critic.value_loss_coef": -1.0}, r"^critic\.value_loss_coef=-1\.0: must be > 0"),
])
def test_what_cannot_run_is_refused_in_one_line(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as err:
        validate(_toy(**overrides), str(tmp_path))
    assert "\n" not in str(err.value)


def test_the_launcher_refuses_before_the_run_starts(tmp_path):
    workdir = tmp_path / "run"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), "--config=configs/ppo.py:toy",
                           f"--workdir={workdir}", "--config.critic.enabled=False"], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "actor.estimator='gae': GAE from critic values needs a value model" in proc.stderr.splitlines()[-1]
    assert not os.path.exists(workdir / "buffer") and not os.path.exists(workdir / "config.json")
