"""Environment interface: Observation validation and make_env dispatch errors (browser-free)."""


import numpy as np
import pytest

from jaxwebrl.env.base import BrowserCrashed, Env, EnvFailure, EnvTimeout, Observation, StepResult
from jaxwebrl.env.registry import make_env


def test_observation_requires_uint8_rgb():
    obs = Observation(goal="g", screenshot=np.zeros((4, 5, 3), np.uint8), url="about:blank")
    assert obs.info == {}
    for bad in (np.zeros((4, 5, 3), np.float32), np.zeros((4, 5), np.uint8), np.zeros((4, 5, 4), np.uint8), [1]):
        with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\]"):
            Observation(goal="g", screenshot=bad)


def test_step_result_done():
    obs = Observation(goal="g", screenshot=np.zeros((1, 1, 3), np.uint8))
    assert StepResult(obs, 0.0, False, True).done
    assert not StepResult(obs, 0.0, False, False).done


def test_failures_are_catchable_as_one_type():
    assert issubclass(BrowserCrashed, EnvFailure) and issubclass(EnvTimeout, EnvFailure)


def test_make_env_rejects_unknown_specs(tmp_path):
    with pytest.raises(ValueError, match="miniwob/<task>"):
        make_env("atari/pong")
    with pytest.raises(TypeError, match="str or a dict"):
        make_env(42)
    with pytest.raises(ValueError, match="missing.json: cannot read it"):
        make_env(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="not valid JSON"):
        make_env("{not json")
    with pytest.raises(ValueError, match="unknown MiniWoB"):
        make_env("miniwob/no-such-task")


def test_make_env_toy_is_browser_free_and_follows_the_protocol():
    env = make_env("toy", screenshot_size=(32, 32))
    assert isinstance(env, Env) and env.task_id == "toy" and env.max_steps >= 1
    obs = env.reset(0)
    assert isinstance(obs, Observation) and obs.screenshot.shape == (32, 32, 3)
    res = env.step("this is not an action")
    assert isinstance(res, StepResult) and res.info["invalid_action"]
    env.close()
