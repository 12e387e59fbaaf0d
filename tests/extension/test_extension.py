"""A loss, an estimator and a task family registered from outside the package, used by a config, run through the
real launcher, policy server, worker processes and trainer; the family's oracle serves the doctor and supervised
demonstrations (docs/interfaces.md, "Extending")."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env.registry import config_action_texts
from jaxwebrl.env import check
from jaxwebrl.env.registry import doctor_specs, make_env
from jaxwebrl.eval.demos import oracle_demonstrations
from jaxwebrl.extensions import ImportOnce, import_extensions
from jaxwebrl.rl import advantages
from jaxwebrl.rollout.spec import worker_spec
from jaxwebrl.train import rl_config
from jaxwebrl.train.config_validation import ConfigError, validate
from jaxwebrl.train.metrics import read_metrics
from tests.launch.test_train_run import ONE_GROUP

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join("tests", "extension", "config.py")


def load_config():
    spec = importlib.util.spec_from_file_location("extension_config", os.path.join(REPO, CONFIG))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_the_config_validates_and_every_registration_takes_effect(tmp_path):
    config = load_config()
    validate(config, str(tmp_path))                     # imports the extension, then checks loss, estimator, env
    assert dict(rl_config.loss_kwargs(config.actor, max_new_tokens=48)) == {"ratio_cap": 1.5}
    adv = rl_config.advantage_config(config.actor, max_new_tokens=48)
    assert adv.estimator == "signed"
    trace = advantages.compute_token_advantages(np.array([1.0, 1.0, 0.0, 0.0], np.float32), np.array([0, 0, 1, 1]),
                                                np.array([0, 0, 0, 0]), np.ones((4, 3), np.int32), config=adv)
    np.testing.assert_allclose(np.asarray(trace.step_advantages), [0.5, 0.5, -0.5, -0.5])   # ±1 / |τ|
    assert config_action_texts(config) == ("click(250, 500)", "click(750, 500)")            # the env's own grammar
    env = make_env("two_presses", screenshot_size=(32, 32), max_steps=9)                    # its fixed horizon
    obs = env.reset(1)
    assert obs.goal == "Press right." and env.max_steps == 2 and obs.screenshot.shape == (32, 32, 3)
    assert env.step("click(750, 500)").reward == 0.0 and env.step("click(750, 500)").reward == 1.0
    demos = oracle_demonstrations(["two_presses"], range(2), action_texts=config_action_texts(config))
    assert [d["response"].split("Action: ")[1] for d in demos] == ["click(250, 500)"] * 2 + ["click(750, 500)"] * 2
    assert "two_presses" in doctor_specs()
    spec = worker_spec(config, buffer_path="b", address="tcp://127.0.0.1:1", token="t", stats_dir=None)
    assert spec["extensions"] == ["tests.extension.plugin"] and spec["worker"]["tasks"] == ["two_presses"]

    config.actor.loss = "not_registered"
    with pytest.raises(ConfigError, match=r"^actor\.loss='not_registered': not a registered loss"):
        validate(config, str(tmp_path))
    config = load_config()
    config.extensions = "tests.extension.no_such_module"
    with pytest.raises(ConfigError, match=r"^extensions: cannot import 'tests\.extension\.no_such_module'"):
        validate(config, str(tmp_path))


@pytest.mark.browser
def test_the_doctor_plays_the_extension_family_with_its_oracle(capsys):
    import_extensions("tests.extension.plugin")
    assert check.main(["--tasks", "two_presses", "--episodes", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"]["two_presses"] == {"success_rate": 1.0, "episodes": 2, "mean_steps": 2.0}


def test_registering_a_taken_name_or_a_wrong_shape_fails_in_one_line():
    import_extensions("tests.extension.plugin")
    from jaxwebrl.env.registry import register_env
    from jaxwebrl.rl.estimators import register_estimator
    from jaxwebrl.rl.losses import register_loss
    from tests.extension import plugin

    register_loss("capped_pg", plugin.capped_pg_loss, ratio_cap=2.0)          # the same registration again: fine
    with pytest.raises(ValueError, match="'capped_pg' is already registered"):
        register_loss("capped_pg", plugin.capped_pg_loss, ratio_cap=3.0)
    with pytest.raises(ValueError, match="takes 5 positional inputs"):
        register_loss("two_args", lambda logprobs, advantages: (0.0, {}))
    with pytest.raises(ValueError, match=r"defaults \['nope'\] are not keyword-only"):
        register_loss("other", plugin.capped_pg_loss, nope=1)
    with pytest.raises(ValueError, match="reward_norm="):
        register_estimator("bad_norm", plugin.signed_estimator, reward_norm=("episode", None, False))
    with pytest.raises(ValueError, match="already taken by the task family 'miniwob'"):
        register_env("miniwob/mine", plugin.TwoPressesEnv)
    with pytest.raises(ValueError, match="already taken by the task family .toy."):
        register_env("toy", plugin.TwoPressesEnv)


def test_a_run_of_the_extension_config_trains_with_all_three(tmp_path):
    workdir = tmp_path / "run"
    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={CONFIG}", f"--workdir={workdir}",
           "--config.train.max_steps=1", ONE_GROUP]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (record,) = read_metrics(str(workdir))
    assert record["step"] == 1 and np.isfinite(record["ppo_actor/update/actor_loss/avg"])
    assert "ppo_actor/update/capped_fraction/avg" in record          # a stat only the extension's loss returns
    episodes, _ = RingBuffer.open(str(workdir / "buffer")).read(None)
    assert episodes and {e.task_id for e in episodes} == {"two_presses"}   # played in the registered env
    with open(workdir / "trained_episodes.jsonl") as f:
        assert len(json.loads(f.readline())["episode_ids"]) >= 4


def test_a_registrys_built_in_modules_load_once_and_a_failed_load_is_retried(tmp_path, monkeypatch):
    asked = []
    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name: asked.append(name) or real(name))
    broken = ImportOnce(("json", "no_such_family_module"))
    for _ in range(2):   # retried, not left half-loaded
        with pytest.raises(ModuleNotFoundError):
            broken()
    assert not broken.done and asked == ["json", "no_such_family_module"] * 2
    # a family module that asks the registry while it loads (as built-in families do) does not restart the list
    (tmp_path / "asks_while_loading.py").write_text("import builtins\nbuiltins.jaxwebrl_test_loader()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    load = ImportOnce(("asks_while_loading", "json"))
    monkeypatch.setattr("builtins.jaxwebrl_test_loader", load, raising=False)
    asked.clear()
    load()
    load()
    assert load.done and asked == ["asks_while_loading", "json"]
