"""Task families: one `TaskFamily` record per family of env specs, and their registry.

A family is a folder `jaxwebrl/env/tasks/<family>/` holding what is its own (its pages, rules, env, oracle) and a
`family.py` that calls `register_family(TaskFamily(...))`. The places that compose families (`env.registry`: specs,
horizons, action texts, envs; `env.check`: the doctor; `eval.demos`: supervised demonstrations) read the record
and never branch on a family's name.

Adding a family: one folder, and its `family` module in `BUILT_IN` (or, from outside the package, in
`config.extensions`: `jaxwebrl.extensions` imports it first in every process). `registry.register_env` makes the
record of a single named Python environment (the simplest family).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jaxwebrl.extensions import ImportOnce

# The families shipped with jaxwebrl, imported on the first lookup (their modules import this one).
BUILT_IN = ("jaxwebrl.env.tasks.toy.family", "jaxwebrl.env.tasks.miniwob.family", "jaxwebrl.env.tasks.chain.family",
            "jaxwebrl.env.tasks.webtask.family", "jaxwebrl.env.tasks.webgym.family",
            "jaxwebrl.env.tasks.sites.family")

# An oracle: (env, the observation it just gave, the step index) -> the next `jaxwebrl.env.agent.actions.Action`.
Oracle = Callable[[Any, Any, int], Any]


def _itself(spec: str) -> list:
    return [spec]


def _the_cap(checked: Any, cap: int) -> int:
    return int(cap)


def _nothing() -> list:
    return []


@dataclasses.dataclass(frozen=True)
class TaskFamily:
    """What one family of env specs gives the rest of the system (`spec`: an entry of a run's `env.tasks`).

    Specs:
      claims(spec) -> bool                 whether a spec (str, or a dict for JSON specs) is this family's; the
                                           families' claims are disjoint (a spec two families claim is refused)
      check(spec) -> checked               validated, nothing built (no browser, no import of user code);
                                           ValueError naming the problem and the fix
      expand(entry) -> [spec]              one `env.tasks` entry as its specs ("miniwob": every bundled task)
    Episodes:
      make(checked, **options) -> Env      options: screenshot_size (W, H), max_steps (the horizon, already
                                           `horizon(checked, cap)`), browser (a Browser to play in, which the env
                                           does not close; a browser-free family drops it), network (Chromium's
                                           network conditions, or None)
      horizon(checked, cap) -> int         the steps an episode plays under the run's cap
      action_texts(checked) -> (str, ...)  what a policy decoding under the action grammar may emit (None: the
                                           default click grid of a browser page, `action_space.CLICK_GRID`)
      needs_browser                        config validation checks that Chromium is installed
      judged                               `make` takes `judge=` (a run's `env.judge` settings: its reward is a
                                           judge's verdict) and `hand_off_verdicts=` (True: the last StepResult
                                           carries the verdict as `pending_reward` instead of waiting for it)
      shares_browser                       a rollout worker may give all such envs one Chromium (same viewport)
    Oracles, the doctor, demonstrations:
      oracle(checked) -> Oracle | None     a scripted policy for the spec (`Oracle` above), or None; the doctor
                                           and `eval.demos` (supervised demonstrations) play it
      doctor_specs() -> [spec]             what `python -m jaxwebrl.env.check` plays by default
    """

    name: str
    claims: Callable[[Any], bool]
    check: Callable[[Any], Any]
    make: Callable[..., Any]
    expand: Callable[[str], list] = _itself
    horizon: Callable[[Any, int], int] = _the_cap
    action_texts: Callable[[Any], tuple[str, ...] | None] | None = None
    needs_browser: bool = True
    shares_browser: bool = False
    judged: bool = False
    oracle: Callable[[Any], Oracle | None] | None = None
    doctor_specs: Callable[[], list] = _nothing


_FAMILIES: dict[str, TaskFamily] = {}
_load_built_in = ImportOnce(BUILT_IN)   # the built-in families register on import


def register_family(family: TaskFamily) -> TaskFamily:
    """Make `family`'s specs ones every run config may list in `env.tasks`. Registering the same record again is a
    no-op; another record under a taken name is a ValueError."""
    if not isinstance(family, TaskFamily):
        raise TypeError(f"register_family takes a TaskFamily, got {type(family).__name__}")
    if not family.name or not isinstance(family.name, str):
        raise ValueError(f"TaskFamily.name={family.name!r}: give the family a non-empty name")
    for field in ("claims", "check", "make", "expand", "horizon", "doctor_specs"):
        if not callable(getattr(family, field)):
            raise TypeError(f"TaskFamily {family.name!r}: {field} must be callable")
    if _FAMILIES.get(family.name, family) != family:
        raise ValueError(f"task family {family.name!r} is already registered: choose another name")
    _FAMILIES[family.name] = family
    return family


def families() -> tuple[TaskFamily, ...]:
    """Every registered family, built-in ones first."""
    _load_built_in()
    return tuple(_FAMILIES.values())


def family_of(spec: Any) -> TaskFamily | None:
    """The family that claims `spec`, or None; a spec two families claim is a ValueError naming both."""
    claimants = [f for f in families() if f.claims(spec)]
    if len(claimants) > 1:
        raise ValueError(f"env spec {spec!r} is claimed by the task families {[f.name for f in claimants]}: "
                         f"make their claims disjoint")
    return claimants[0] if claimants else None
