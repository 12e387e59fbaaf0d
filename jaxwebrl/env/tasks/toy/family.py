"""The toy family's record: the spec "toy", a fixed three-turn horizon, two action texts, an exact oracle."""

from __future__ import annotations

from jaxwebrl.env.agent.actions import parse_action
from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.env.tasks.toy.toy import ACTION_TEXTS, NUM_TURNS, ToyEnv, oracle_action_text

NAME = "toy"


def _check(spec: str) -> str:
    if spec != NAME:
        raise ValueError(f"env spec {spec!r}: 'toy' takes no options: drop the '?{spec.partition('?')[2]}'")
    return spec


def _make(spec: str, *, screenshot_size=(64, 64), max_steps=None, network=None, browser=None) -> ToyEnv:
    del max_steps, network, browser   # the toy plays its own three turns, without a browser
    return ToyEnv(screenshot_size=screenshot_size)


def _oracle(env, observation, step: int):
    return parse_action(oracle_action_text(observation.goal, step))


TOY = register_family(TaskFamily(
    name=NAME, claims=lambda spec: isinstance(spec, str) and spec.partition("?")[0] == NAME, check=_check,
    make=_make, horizon=lambda spec, cap: NUM_TURNS, action_texts=lambda spec: ACTION_TEXTS, needs_browser=False,
    oracle=lambda spec: _oracle, doctor_specs=lambda: [NAME]))
