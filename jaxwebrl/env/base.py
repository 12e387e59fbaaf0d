"""The environment interface every task source shares: toy, MiniWoB++, JSON web-task specs, registered envs.

    env = make_env("miniwob/click-test")      # jaxwebrl.env.registry: "toy", a JSON task spec, a registered name
    obs = env.reset(seed=0)                   # Observation
    res = env.step(action)                    # StepResult; `action` is an Action or model text
    env.close()

Failure contract (the rollout worker's recovery is built on it):
- A task-level problem (bad action, wrong answer) is never an exception: the action is marked invalid in
  `info` and the episode goes on.
- A broken environment (browser crashed, hung, or its driver died) raises `EnvFailure` (subclasses
  `BrowserCrashed`, `EnvTimeout`) from `reset` or `step`. The episode must be marked `env_failed`. The same
  env object stays usable: its next `reset(seed)` starts a fresh browser. `close()` never raises.
- A fault of the task, not of the browser, is an `EnvFailure` too (the episode is env-failed, never scored) that
  names its real cause: `PageFault` (the page did not load, opened windows without end, left its allowed origin,
  hit the memory limit; `PageScriptError` when script run in it threw) and `TaskSpecFault` (the spec's own
  evaluator raised). Only `BrowserCrashed` and `EnvTimeout` point at the browser installation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import numpy as np

from jaxwebrl.env.agent.actions import Action


class EnvFailure(RuntimeError):
    """The environment itself broke (not the agent): mark the episode env_failed and call reset again."""


class BrowserCrashed(EnvFailure):
    """Chromium or chromedriver died (killed, out of memory, crashed renderer)."""


class EnvTimeout(EnvFailure):
    """The browser did not answer within the per-call timeout (a hung page or renderer)."""


class PageFault(EnvFailure):
    """The task's page, not the browser, failed or misbehaved (did not load, opened windows without end, left
    its allowed origin, hit its memory limit): the episode ends env-failed with this reason."""


class PageScriptError(PageFault):
    """JavaScript run in the page threw (the browser is fine)."""


class TaskSpecFault(EnvFailure):
    """The task spec itself is at fault (its evaluator raised): the message names the spec, the evaluator and the
    error; fix the spec."""


def browser_is_the_cause(failure: BaseException | None) -> bool:
    """Whether `failure` points at the browser (crashed, hung, driver gone) rather than at the task or its page."""
    return isinstance(failure, EnvFailure) and not isinstance(failure, (PageFault, TaskSpecFault))


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
    pending_reward: only on the last step of an env told to hand its judging off (a judged family made with
        `hand_off_verdicts=True`): a `concurrent.futures.Future` of (reward, info of the verdict), or of the
        `EnvFailure` the judge raised; `reward` reads 0.0 here, and the worker writes the episode with the
        Future's reward once it settles (`rollout/awaiting.py`).
    """

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict = dataclasses.field(default_factory=dict)
    pending_reward: Any = None

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
