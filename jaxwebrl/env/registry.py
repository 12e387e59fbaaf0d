"""Env specs: the names a run config's `env.tasks` lists, checked before anything starts and built in a worker.

Every spec belongs to one task family (`jaxwebrl.env.families.TaskFamily`, one folder under env/tasks/ each):

    "toy"               the browser-free toy task (`tasks/toy`)
    "miniwob/<task>"    a bundled MiniWoB++ task in headless Chromium; "miniwob" alone in `env.tasks`: all of them;
                        "miniwob/<task>?reward=strict" wins only on a perfect answer (`tasks/miniwob`)
    "chain/<split>..."  the `chain` family, options after a "?": "chain/hard?trap=1" (`tasks/chain`)
    a JSON task spec    a dict, JSON text or a path to a .json file; a task set in `env.tasks`: a .jsonl file (line
                        N is the spec "FILE.jsonl:N") or a directory of .json / .jsonl spec files (`tasks/webtask`)
    "webgym:FILE.jsonl" a task file in WebGym's own format (line N: "webgym:FILE.jsonl:N"; `tasks/webgym`)
    a registered name   a Python environment class registered with `register_env` or a family registered with
                        `families.register_family` (an extension module, see `jaxwebrl.extensions`)

    specs = env_specs("toy,miniwob/click-test,tasks/shop.jsonl")   # env.tasks as a list of specs
    check_env_spec(spec)                             # validated only: no browser starts, no evaluator is imported
    env = make_env(spec, screenshot_size=(W, H), max_steps=N)
    env = make_env(spec, latency={"regime": "web", "seed": 0})   # the "web" latency regime (jaxwebrl.env.latency)
    texts = action_texts(specs)                      # what a policy decoding under the action grammar may emit

Registering an environment (from outside the package):

    register_env("counter", CounterEnv, action_texts=("click(250, 500)", "click(750, 500)"))

`CounterEnv(screenshot_size=(W, H), max_steps=N)` must give an object with the `jaxwebrl.env.base.Env` interface
(`task_id`, `max_steps`, `reset(seed) -> Observation`, `step(action) -> StepResult`, `close()`); `action_texts`
is what a policy decoding under the action grammar may emit in it (`jaxwebrl.env.agent.action_space`; None: the click
grid of a browser page); `needs_browser=True` makes config validation check that Chromium is installed;
`takes_max_steps=False` for an env with a fixed horizon of its own (`make_env` then leaves `max_steps` out);
`takes_browser=True` for a browser env that can share a `browser=` (otherwise `make_env` leaves it out);
`options(query) -> dict` turns a spec's text after "?" into keyword options for the factory (ValueError naming the
problem; called by `check_env_spec` too, so a bad option fails before anything starts); `horizon(query) -> int`
gives a fixed-horizon env's own horizon for a spec (`task_horizon`: what a buffer is sized for); `oracle(env,
observation, step) -> Action` a scripted policy (demonstrations, the doctor).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxwebrl.env.agent.action_space import CLICK_GRID
from jaxwebrl.env.base import Env
from jaxwebrl.env.browser.memory_bound import bound_browser_memory
from jaxwebrl.env.families import Oracle, TaskFamily, families, family_of, register_family
from jaxwebrl.env.latency import LatencyConfig, LatencyEnv


def env_specs(tasks: str) -> list:
    """A config's `env.tasks` (comma-separated specs) as a list, each entry expanded by its family ("miniwob"
    alone: every bundled task, a .jsonl task set: one "FILE.jsonl:N" per non-blank line, a directory: its .json /
    .jsonl files). A task set that cannot be read is a ValueError (one line naming it)."""
    out: list = []
    for entry in (s.strip() for s in str(tasks).split(",")):
        if entry:
            family = family_of(entry)
            out.extend([entry] if family is None else family.expand(entry))
    return out


def _family(spec: Any) -> TaskFamily:
    """The family of a spec (or of what a family checked, e.g. a `WebTaskSpec`); an unknown spec is a ValueError
    naming the families, one of another type a TypeError."""
    family = family_of(spec.strip() if isinstance(spec, str) else spec)
    if family is None and not isinstance(spec, (str, Mapping)):
        raise TypeError(f"environment spec must be a str or a dict, got {type(spec).__name__}")
    if family is None:
        raise ValueError(f"unknown environment spec {spec!r}: use 'toy', 'miniwob/<task>' (e.g. 'miniwob/click-test'), "
                         f"a chain spec, a JSON task spec, a path to a .json task file, 'webgym:FILE.jsonl', or a "
                         f"registered env (families: {', '.join(f.name for f in families())}); an extension's env "
                         f"must be imported first (config.extensions)")
    return family


def check_env_spec(spec: Any) -> Any:
    """Validate an env spec without building anything (no browser starts, no python evaluator is imported).

    Returns what its family checked: the spec text of a named env ("toy", "miniwob/<task>", "chain/easy?trap=1")
    or the `WebTaskSpec` of a JSON spec (dict, JSON text, .json path, or line "FILE.jsonl:N" of a task set).
    Raises ValueError (a `TaskSpecError` for JSON specs) that names the problem and the fix, TypeError for a spec
    that is neither str nor dict.
    """
    return _family(spec).check(spec.strip() if isinstance(spec, str) else spec)


def _checked(spec: Any) -> tuple[TaskFamily, Any]:
    family = _family(spec)
    return family, family.check(spec.strip() if isinstance(spec, str) else spec)


def needs_browser(specs) -> bool:
    """Whether any of `specs` plays in Chromium (its family says so)."""
    return any(_family(spec).needs_browser for spec in specs)


def shares_browser(spec: Any) -> bool:
    """Whether a rollout worker may give `spec`'s env the one Chromium its envs share (`families.TaskFamily`)."""
    return _family(spec).shares_browser


def make_env(spec: Any, *, latency: Mapping | None = None, judge: Mapping | None = None,
             browser_memory_mb: int | None = None, hand_off_verdicts: bool = False, **options) -> Env:
    """Build the environment `spec` names (validated by its family first).

    latency: a run's `env.latency` as a dict (`jaxwebrl.env.latency.LatencyConfig`; None or regime "local": off).
        In the "web" regime the env is wrapped in a `LatencyEnv` (a page delay after every reset and step) and
        a browser env gets Chromium's network conditions (where its family takes them).
    judge: a run's `env.judge` as a dict (the backend and its settings), for families whose reward a judge gives
        (`TaskFamily.judged`: WebGym tasks); None: the ground truth.
    browser_memory_mb: a run's `env.browser_memory_mb`: the env's browser joins this process's (one worker's) one
        memory bound over all its browsers (`jaxwebrl.env.browser.memory_bound`); None: no such bound.
    hand_off_verdicts: a judged env's last step does not wait for its verdict: `StepResult.pending_reward` is a
        Future of it (the rollout worker's way, so a browser never waits on a judge); False: the env waits.
    options: `screenshot_size` (W, H), `max_steps` (a cap: the env plays `task_horizon(spec, max_steps)`),
    `browser` (a Browser to play in, not closed by the env; families without a browser leave it out).
    """
    family, checked = _checked(spec)
    regime = LatencyConfig.from_dict(latency)
    if options.get("max_steps") is not None:
        options["max_steps"] = family.horizon(checked, options["max_steps"])
    if family.judged:
        options.update(judge=judge, hand_off_verdicts=hand_off_verdicts)
    env = family.make(checked, network=regime.network, **options)
    if browser_memory_mb is not None:
        bound_browser_memory(env, browser_memory_mb)
    return LatencyEnv(env, regime) if regime.enabled else env


def task_horizon(spec: Any, cap: int) -> int:
    """The steps an episode of `spec` may take under the run's `env.max_episode_steps` = `cap`: the task's own
    horizon when it is shorter (a JSON spec's `max_steps`, a MiniWoB++ task's split horizon), else `cap`; a
    family with a fixed horizon (toy, chain) plays its own whatever the cap (docs/env.md, "horizon")."""
    family, checked = _checked(spec)
    return int(family.horizon(checked, cap))


def run_horizon(specs: list, cap: int) -> int:
    """The longest horizon of a run's tasks (`task_horizon` of each): what a buffer sized per episode must hold."""
    return max(task_horizon(spec, cap) for spec in specs)


def task_oracle(spec: Any) -> Oracle:
    """The scripted oracle of `spec` (its family's); a ValueError naming the spec when it has none."""
    family, checked = _checked(spec)
    oracle = family.oracle(checked) if family.oracle is not None else None
    if oracle is None:
        raise ValueError(f"no scripted oracle for {spec!r} (task family {family.name!r}): demonstrations and the "
                         f"doctor need a spec with one: {', '.join(doctor_specs())}")
    return oracle


def doctor_specs() -> list:
    """Every family's specs the doctor plays by default (each with an oracle)."""
    return [spec for family in families() for spec in family.doctor_specs()]


def action_texts(specs) -> tuple[str, ...]:
    """The action texts a constrained policy may emit for these env specs (each text once, in first-seen order):
    each spec's family's texts, the default click grid (`action_space.CLICK_GRID`) where it has none."""
    texts: list[str] = []
    seen: set[str] = set()
    for spec in specs:
        family, checked = _checked(spec)
        own = (family.action_texts(checked) if family.action_texts is not None else None) or CLICK_GRID
        texts += [t for t in own if t not in seen]
        seen.update(own)
    return tuple(texts)


def config_action_texts(config) -> tuple[str, ...] | None:
    """The run config's constrained action texts (of `env.tasks`), or None when `model.constrained_actions` is off."""
    return action_texts(env_specs(config.env.tasks)) if config.model.constrained_actions else None


@dataclasses.dataclass(frozen=True)
class _NamedEnv:
    """The record of one environment registered by `register_env` (see the module docstring)."""

    name: str
    factory: Callable[..., Env]
    texts: tuple[str, ...] | None
    takes_max_steps: bool
    takes_browser: bool
    options: Callable[[str], dict] | None
    own_horizon: Callable[[str], int] | None

    def claims(self, spec: Any) -> bool:
        return isinstance(spec, str) and spec.partition("?")[0] == self.name

    def check(self, spec: str) -> str:
        self.spec_options(spec)
        return spec

    def spec_options(self, spec: str) -> dict:
        """The keyword options of the spec's "?..." part ({} without one); ValueError naming the problem."""
        name, mark, query = spec.partition("?")
        if not mark:
            return {}
        if self.options is None:
            raise ValueError(f"env spec {spec!r}: {name!r} takes no options: drop the '?{query}'")
        return dict(self.options(query))

    def make(self, spec: str, *, network=None, **options) -> Env:
        del network   # a registered Python env emulates no network
        if not self.takes_max_steps:
            options.pop("max_steps", None)
        if not self.takes_browser:
            options.pop("browser", None)
        return self.factory(**options, **self.spec_options(spec))

    def horizon(self, spec: str, cap: int) -> int:
        if self.own_horizon is None:
            return int(cap)
        own = int(self.own_horizon(spec.partition("?")[2]))
        return own if not self.takes_max_steps else min(int(cap), own)

    def action_texts(self, spec: str) -> tuple[str, ...] | None:
        return self.texts


def register_env(name: str, factory: Callable[..., Env], *, action_texts=None, needs_browser: bool = False,
                 takes_max_steps: bool = True, takes_browser: bool = False,
                 options: Callable[[str], dict] | None = None,
                 horizon: Callable[[str], int] | None = None, oracle: Oracle | None = None) -> TaskFamily:
    """Make `name` an env spec every run config can list in `env.tasks` (see the module docstring): a task family
    of one name. Registering the same factory again is a no-op; a name another family claims is a ValueError."""
    if not isinstance(name, str) or not name.strip() or name != name.strip() or "," in name or "?" in name:
        raise ValueError(f"env name {name!r}: give a non-empty name without commas, '?' or surrounding spaces")
    if not callable(factory):
        raise TypeError(f"register_env({name!r}, ...): the factory must be callable (an Env class), "
                        f"got {type(factory).__name__}")
    for field, value, what in (("options", options, "query text -> dict"), ("horizon", horizon, "query text -> int"),
                               ("oracle", oracle, "(env, observation, step) -> Action")):
        if value is not None and not callable(value):
            raise TypeError(f"register_env({name!r}, ...): {field} must be callable ({what}) or None")
    texts = None if action_texts is None else tuple(action_texts)
    if texts is not None and (not texts or not all(isinstance(t, str) and t for t in texts)):
        raise ValueError(f"register_env({name!r}, ...): action_texts must be non-empty strings (or None)")
    named = _NamedEnv(name, factory, texts, bool(takes_max_steps), bool(takes_browser), options, horizon)
    taken = family_of(name)
    if taken is not None:
        if taken.name == name and getattr(taken.make, "__self__", None) == named:
            return taken
        raise ValueError(f"env name {name!r} is already taken by the task family {taken.name!r}: choose another name")
    return register_family(TaskFamily(
        name=name, claims=named.claims, check=named.check, make=named.make, horizon=named.horizon,
        action_texts=named.action_texts, needs_browser=bool(needs_browser),
        oracle=None if oracle is None else (lambda spec: oracle), doctor_specs=(lambda: [name]) if oracle else list))
