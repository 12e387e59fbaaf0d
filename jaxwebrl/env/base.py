"""The environment interface every task source shares: toy, MiniWoB++ and JSON web-task specs.

    env = make_env("miniwob/click-test")      # or "toy", or a JSON task spec (dict, JSON text, or .json path)
    obs = env.reset(seed=0)                   # Observation
    res = env.step(action)                    # StepResult; `action` is an Action or model text
    env.close()

Failure contract (the rollout worker's recovery is built on it):
- A task-level problem (bad action, wrong answer) is never an exception: the action is marked invalid in
  `info` and the episode goes on.
- A broken environment (browser crashed, hung, or its driver died) raises `EnvFailure` (subclasses
  `BrowserCrashed`, `EnvTimeout`) from `reset` or `step`. The episode must be marked `env_failed`. The same
  env object stays usable: its next `reset(seed)` starts a fresh browser. `close()` never raises.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from jaxwebrl.env.actions import Action


class EnvFailure(RuntimeError):
    """The environment itself broke (not the agent): mark the episode env_failed and call reset again."""


class BrowserCrashed(EnvFailure):
    """Chromium or chromedriver died (killed, out of memory, crashed renderer)."""


class EnvTimeout(EnvFailure):
    """The browser did not answer within the per-call timeout (a hung page or renderer)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the agent sees after reset or a step.

    goal: the task instruction in natural language.
    screenshot: uint8 [H, W, 3] RGB pixels of the task area.
    url: the page's current URL ("" for browser-free environments).
    info: extra task data (e.g. MiniWoB++ `fields`); never needed to act.
    """

    goal: str
    screenshot: np.ndarray
    url: str = ""
    info: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        shot = self.screenshot
        if not isinstance(shot, np.ndarray) or shot.dtype != np.uint8 or shot.ndim != 3 or shot.shape[2] != 3:
            desc = f"{type(shot).__name__} {getattr(shot, 'dtype', '')} {getattr(shot, 'shape', '')}"
            raise ValueError(f"Observation.screenshot must be uint8 [H, W, 3], got {desc}")


@dataclasses.dataclass(frozen=True)
class StepResult:
    """Outcome of one step.

    reward: float, the raw episode reward once the episode ended (0.0 before).
    terminated: the task ended (success, failure, or an `answer` action).
    truncated: the step budget (`max_steps`) ran out before the task ended.
    info: per-step facts; always has `invalid_action` (bool), `action_error` (str or None) and `step` (int).
    """

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict = dataclasses.field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


@runtime_checkable
class Env(Protocol):
    """One task family behind one interface. `task_id` names the task (e.g. "miniwob/click-test");
    `max_steps` is the horizon after which `step` reports truncated=True."""

    task_id: str
    max_steps: int

    def reset(self, seed: int) -> Observation: ...

    def step(self, action: Action | str) -> StepResult: ...

    def close(self) -> None: ...


MINIWOB_PREFIX = "miniwob/"


def check_env_spec(spec: Any) -> Any:
    """Validate an env spec without building anything (no browser starts, no python evaluator is imported).

    Returns "toy", "miniwob/<task>" or the `WebTaskSpec` of a JSON spec (dict, JSON text, or .json path).
    Raises ValueError (a `TaskSpecError` for JSON specs) that names the problem and the fix, TypeError for a
    spec that is neither str nor dict.
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text == "toy":
            return text
        if text.startswith(MINIWOB_PREFIX):
            from jaxwebrl.env.miniwob import available_tasks

            if text[len(MINIWOB_PREFIX):] not in available_tasks():
                raise ValueError(f"unknown MiniWoB++ task {text!r}: see the miniwob package's html/miniwob/*.html")
            return text
        from jaxwebrl.env.task_spec import TaskSpecError, WebTaskSpec, load_spec_file

        if text.startswith("{"):
            try:
                data = json.loads(text)
            except (ValueError, RecursionError) as err:
                raise TaskSpecError(f"task spec (inline JSON text): not valid JSON ({err}): fix the text") from None
            return WebTaskSpec.from_dict(data)
        if text.endswith(".json"):
            return load_spec_file(text)
        raise ValueError(
            f"unknown environment spec {spec!r}: use 'toy', 'miniwob/<task>' (e.g. 'miniwob/click-test'), "
            "a JSON task spec, or a path to a .json task file"
        )
    if isinstance(spec, Mapping):
        from jaxwebrl.env.task_spec import WebTaskSpec

        return WebTaskSpec.from_dict(dict(spec))
    raise TypeError(f"environment spec must be a str or a dict, got {type(spec).__name__}")


def make_env(spec: Any, **options) -> Env:
    """Build an environment from a spec.

    spec: "toy" (browser-free, `jaxwebrl.env.toy.ToyEnv`), "miniwob/<task>" (a bundled MiniWoB++ task),
    or a JSON task spec: a dict, a JSON string, or a path to a .json file with
    `{task_id, start_url, goal, max_steps, difficulty, evaluator}` (validated by `check_env_spec` first).
    options: passed to the environment's constructor (e.g. `screenshot_size`, `max_steps`, `browser`).
    """
    checked = check_env_spec(spec)
    if checked == "toy":
        from jaxwebrl.env.toy import ToyEnv  # lazy: keeps browser-free users free of selenium

        return ToyEnv(**options)
    if isinstance(checked, str):
        from jaxwebrl.env.miniwob import MiniWobEnv

        return MiniWobEnv(checked[len(MINIWOB_PREFIX):], **options)
    from jaxwebrl.env.webtask import WebTaskEnv

    return WebTaskEnv(checked, **options)
