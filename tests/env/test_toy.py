"""Toy environment: exact terminal verifier over all 4 x 2^3 paths, rendering, invalid actions."""

import itertools

import numpy as np
import pytest

from jaxwebrl.env.tasks.toy import toy
from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.base import Env
from jaxwebrl.env.registry import make_env


def play(env, seed, texts):
    env.reset(seed)
    results = [env.step(t) for t in texts]
    return results


def test_verifier_is_exact_over_every_path():
    env = make_env("toy")
    assert isinstance(env, Env)
    for instruction, path in enumerate(toy.TARGET_PATHS):
        for candidate in itertools.product((0, 1), repeat=3):
            results = play(env, seed=instruction + 4 * 7, texts=[toy.ACTION_TEXTS[a] for a in candidate])
            assert [r.terminated for r in results] == [False, False, True]
            assert [r.reward for r in results[:2]] == [0.0, 0.0]
            assert results[-1].reward == (1.0 if candidate == path else 0.0)
            assert results[-1].info["success"] == (candidate == path)
            assert not any(r.truncated for r in results)


def test_oracle_and_instruction_from_seed():
    env = toy.ToyEnv()
    for seed in range(8):
        obs = env.reset(seed)
        assert obs.goal == toy.INSTRUCTIONS[seed % 4]
        assert env.target_path == toy.TARGET_PATHS[seed % 4]
        for turn in range(3):
            res = env.step(toy.oracle_action_text(obs.goal, turn))
        assert res.reward == 1.0


def test_any_click_in_a_half_presses_that_button_and_canonical_text_works():
    env = toy.ToyEnv()
    env.reset(0)  # "Press left, left, right." = [0, 0, 1]
    assert env.step(Action("click", x=0, y=999)).info["press"] == 0
    assert env.step(format_action(Action("click", x=499, y=10))).info["press"] == 0
    assert env.step('<tool_call>{"name": "computer_use", "arguments": {"action": "click", '
                    '"coordinate": [500, 3]}}</tool_call>').reward == 1.0


def test_invalid_and_non_click_actions_use_a_turn_and_fail():
    env = toy.ToyEnv()
    env.reset(1)
    bad = env.step("I think I will press something")
    assert bad.info["invalid_action"] and bad.info["press"] == toy.NO_PRESS and bad.info["action_error"]
    other = env.step('type(text="hello")')
    assert not other.info["invalid_action"] and "only takes clicks" in other.info["action_error"]
    last = env.step(toy.ACTION_TEXTS[0])
    assert last.terminated and last.reward == 0.0
    with pytest.raises(RuntimeError, match="reset"):
        env.step(toy.ACTION_TEXTS[0])


def test_screenshot_is_deterministic_and_shows_progress():
    env = toy.ToyEnv(screenshot_size=(48, 40))  # (W, H), as MiniWoB++ envs take it
    first = env.reset(2).screenshot
    assert first.dtype == np.uint8 and first.shape == (40, 48, 3)
    assert np.array_equal(first, toy.ToyEnv(screenshot_size=(48, 40)).reset(6).screenshot)
    after0 = env.step(toy.ACTION_TEXTS[0]).observation.screenshot
    after1 = env.step(toy.ACTION_TEXTS[1]).observation.screenshot
    assert not np.array_equal(first, after0) and not np.array_equal(after0, after1)
    env.reset(2)
    env.step(toy.ACTION_TEXTS[1])
    assert not np.array_equal(env.step(toy.ACTION_TEXTS[1]).observation.screenshot, after1)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="screenshot_size"):
        toy.ToyEnv(screenshot_size=(8, 8))
    with pytest.raises(ValueError, match="3 turns"):
        toy.ToyEnv(max_steps=5)
    with pytest.raises(RuntimeError, match="reset"):
        toy.ToyEnv().step(toy.ACTION_TEXTS[0])
    with pytest.raises(ValueError, match="not a toy instruction"):
        toy.oracle_action_text("open the pod bay doors", 0)
