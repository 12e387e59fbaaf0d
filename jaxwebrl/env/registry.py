"""Env specs: the names a run config's `env.tasks` lists, checked before anything starts and built in a worker.

    "toy"               the browser-free toy task (`jaxwebrl.env.tasks.toy`)
    "miniwob/<task>"    a bundled MiniWoB++ task in headless Chromium; "miniwob" alone in `env.tasks`: all of them;
                        "miniwob/<task>?reward=strict" wins only on a perfect answer (`miniwob_tasks.REWARDS`)
    a JSON task spec    a dict, JSON text or a path to a .json file (`jaxwebrl.env.tasks.task_spec`)
    a task set          in `env.tasks`: a .jsonl file (one task spec per line: line N is the spec "FILE.jsonl:N")
                        or a directory of .json / .jsonl spec files (sorted by name, not recursive)
    a registered name   a Python environment class registered with `register_env` (an extension module, see
                        `jaxwebrl.extensions`), e.g. "counter"; one registered with `options` also takes them
                        after a "?": "chain/hard?trap=1" (the `chain` family, `jaxwebrl.env.tasks.chain_tasks`)

    specs = env_specs("toy,miniwob/click-test,tasks/shop.jsonl")   # env.tasks as a list of specs
    check_env_spec(spec)                             # validated only: no browser starts, no evaluator is imported
    env = make_env(spec, screenshot_size=(W, H), max_steps=N)
    env = make_env(spec, latency={"regime": "web", "seed": 0})   # the "web" latency regime (jaxwebrl.env.latency)

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
gives a fixed-horizon env's own horizon for a spec (`task_horizon`: what a buffer is sized for).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping

from jaxwebrl.env.base import Env
from jaxwebrl.env.latency import LatencyConfig, LatencyEnv
from jaxwebrl.env.tasks import chain_tasks, toy
from jaxwebrl.env.tasks.miniwob_tasks import available_tasks, click_grid, horizon, miniwob_options
from jaxwebrl.env.tasks.task_spec import TaskSpecError, WebTaskSpec, load_spec_file, load_spec_line, spec_lines

MINIWOB_PREFIX = "miniwob/"
ALL_MINIWOB = "miniwob"   # in env.tasks: every bundled MiniWoB++ task
JSONL_SUFFIX = ".jsonl"   # a task set: one JSON task spec per line
_JSONL_LINE = re.compile(r"(.+\.jsonl):(\d+)")   # its line N as an env spec


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """A registered environment (see the module docstring): `factory(**options) -> Env`."""

    factory: Callable[..., Env]
    action_texts: tuple[str, ...] | None = None
    needs_browser: bool = False
    takes_max_steps: bool = True
    takes_browser: bool = False
    options: Callable[[str], dict] | None = None
    horizon: Callable[[str], int] | None = None


_REGISTRY: dict[str, EnvEntry] = {}


def register_env(name: str, factory: Callable[..., Env], *, action_texts=None, needs_browser: bool = False,
                 takes_max_steps: bool = True, takes_browser: bool = False,
                 options: Callable[[str], dict] | None = None,
                 horizon: Callable[[str], int] | None = None) -> None:
    """Make `name` an env spec every run config can list in `env.tasks` (see the module docstring). Registering
    the same factory again is a no-op; another factory under a taken name is a ValueError."""
    if not isinstance(name, str) or not name.strip() or name != name.strip() or "," in name or "?" in name:
        raise ValueError(f"env name {name!r}: give a non-empty name without commas, '?' or surrounding spaces")
    if (name == ALL_MINIWOB or name.startswith(MINIWOB_PREFIX) or name.endswith((".json", JSONL_SUFFIX))
            or name.startswith("{")):
        raise ValueError(f"env name {name!r} looks like a MiniWoB++ task or a JSON task spec: choose another name")
    if not callable(factory):
        raise TypeError(f"register_env({name!r}, ...): the factory must be callable (an Env class), "
                        f"got {type(factory).__name__}")
    if options is not None and not callable(options):
        raise TypeError(f"register_env({name!r}, ...): options must be callable (query text -> dict) or None")
    if horizon is not None and not callable(horizon):
        raise TypeError(f"register_env({name!r}, ...): horizon must be callable (query text -> int) or None")
    entry = EnvEntry(factory, None if action_texts is None else tuple(action_texts), bool(needs_browser),
                     bool(takes_max_steps), bool(takes_browser), options, horizon)
    if entry.action_texts is not None and (not entry.action_texts
                                           or not all(isinstance(t, str) and t for t in entry.action_texts)):
        raise ValueError(f"register_env({name!r}, ...): action_texts must be non-empty strings (or None)")
    if _REGISTRY.get(name, entry) != entry:
        raise ValueError(f"env name {name!r} is already registered to {_REGISTRY[name].factory!r}: choose another name")
    _REGISTRY[name] = entry


def registered_entry(spec: Any) -> EnvEntry | None:
    """The registry entry of `spec` when it names a registered env (options after "?" aside), else None."""
    return _REGISTRY.get(spec.strip().partition("?")[0]) if isinstance(spec, str) else None


def _spec_options(spec: str, entry: EnvEntry) -> dict:
    """The keyword options of a registered spec's "?..." part ({} without one); ValueError naming the problem."""
    name, mark, query = spec.strip().partition("?")
    if not mark:
        return {}
    if entry.options is None:
        raise ValueError(f"env spec {spec!r}: {name!r} takes no options: drop the '?{query}'")
    return dict(entry.options(query))


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


register_env("toy", toy.ToyEnv, action_texts=toy.ACTION_TEXTS, takes_max_steps=False,
             horizon=lambda query: toy.NUM_TURNS)
for _name in chain_tasks.chain_names():
    register_env(_name, chain_tasks.ChainFactory(_name), needs_browser=True, takes_max_steps=False,
                 takes_browser=True, options=chain_tasks.ChainOptions(_name), horizon=chain_tasks.ChainHorizon(_name))


def env_specs(tasks: str) -> list[str]:
    """A config's `env.tasks` (comma-separated specs) as a list; "miniwob" alone expands to every bundled task,
    a .jsonl task set to one "FILE.jsonl:N" per non-blank line, a directory to its .json / .jsonl files. A task
    set that cannot be read or a directory without spec files is a TaskSpecError (one line naming it)."""
    out: list[str] = []
    for spec in (s.strip() for s in str(tasks).split(",")):
        if spec == ALL_MINIWOB:
            out.extend(MINIWOB_PREFIX + name for name in available_tasks())
        elif registered_entry(spec) is not None or spec.startswith(MINIWOB_PREFIX) or spec.startswith("{"):
            out.append(spec)
        elif spec.endswith(JSONL_SUFFIX):
            out.extend(f"{spec}:{number}" for number in spec_lines(spec))
        elif spec and os.path.isdir(spec):
            out.extend(_directory_specs(spec))
        elif spec:
            out.append(spec)
    return out


def _directory_specs(directory: str) -> list[str]:
    names = sorted(n for n in os.listdir(directory) if n.endswith((".json", JSONL_SUFFIX))
                   and os.path.isfile(os.path.join(directory, n)))
    if not names:
        raise TaskSpecError(f"task set {directory}: no .json or .jsonl task spec files in it: add some, or name "
                            "the files themselves")
    out: list[str] = []
    for name in names:
        path = os.path.join(directory, name)
        out.extend([f"{path}:{n}" for n in spec_lines(path)] if name.endswith(JSONL_SUFFIX) else [path])
    return out


def needs_browser(specs) -> bool:
    """Whether any of `specs` plays in Chromium (MiniWoB++ and JSON web tasks do; registered envs say so)."""
    for spec in specs:
        entry = registered_entry(spec)
        if entry is None or entry.needs_browser:
            return True
    return False


def check_env_spec(spec: Any) -> Any:
    """Validate an env spec without building anything (no browser starts, no python evaluator is imported).

    Returns the registered name ("toy", ...), "miniwob/<task>" or the `WebTaskSpec` of a JSON spec (dict, JSON
    text, .json path, or line "FILE.jsonl:N" of a task set). Raises ValueError (a `TaskSpecError` for JSON specs) that names the problem and the fix,
    TypeError for a spec that is neither str nor dict.
    """
    if isinstance(spec, str):
        text = spec.strip()
        entry = registered_entry(text)
        if entry is not None:
            _spec_options(text, entry)
            return text
        if text.startswith(MINIWOB_PREFIX):
            task, _, query = text[len(MINIWOB_PREFIX):].partition("?")
            if task not in available_tasks():
                raise ValueError(f"unknown MiniWoB++ task {text!r}: see the miniwob package's html/miniwob/*.html")
            miniwob_options(query)
            return text
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except (ValueError, RecursionError) as err:
                raise TaskSpecError(f"task spec (inline JSON text): not valid JSON ({err}): fix the text") from None
            return WebTaskSpec.from_dict(data)
        if text.endswith(".json"):
            return load_spec_file(text)
        line = _JSONL_LINE.fullmatch(text)
        if line:
            return load_spec_line(line.group(1), int(line.group(2)))
        if text.endswith(JSONL_SUFFIX):
            raise ValueError(f"task set {text!r} holds one spec per line: list it in env.tasks (or pass it through "
                             f"env_specs), or name one line as '{text}:N'")
        registered = f", or a registered env ({', '.join(registered_names())})"
        raise ValueError(f"unknown environment spec {spec!r}: use 'toy', 'miniwob/<task>' (e.g. 'miniwob/click-test'), "
                         f"a JSON task spec, a path to a .json task file{registered}; an extension's env must be "
                         f"imported first (config.extensions)")
    if isinstance(spec, Mapping):
        return WebTaskSpec.from_dict(dict(spec))
    raise TypeError(f"environment spec must be a str or a dict, got {type(spec).__name__}")


def make_env(spec: Any, *, latency: Mapping | None = None, **options) -> Env:
    """Build the environment `spec` names (validated by `check_env_spec` first).

    latency: a run's `env.latency` as a dict (`jaxwebrl.env.latency.LatencyConfig`; None or regime "local": off).
        In the "web" regime the env is wrapped in a `LatencyEnv` (a page delay after every reset and step) and
        a MiniWoB++ or JSON web task gets Chromium's network conditions.
    options: passed to the environment's constructor: `screenshot_size` (W, H), `max_steps` (a cap: the env plays
    `task_horizon(spec, max_steps)`; left out for an env with a fixed horizon), `browser` (a shared Browser,
    MiniWoB++ and JSON web tasks only).
    """
    checked = check_env_spec(spec)
    regime = LatencyConfig.from_dict(latency)
    if options.get("max_steps") is not None:
        options["max_steps"] = task_horizon(checked, options["max_steps"])
    env = _make_checked(checked, regime.network, options)
    return LatencyEnv(env, regime) if regime.enabled else env


def task_horizon(spec: Any, cap: int) -> int:
    """The steps an episode of `spec` may take under the run's `env.max_episode_steps` = `cap`: the task's own
    horizon (a JSON spec's `max_steps`, a MiniWoB++ task's split horizon) when it is shorter, else `cap`; a
    registered env with a fixed horizon (`takes_max_steps=False`: toy, chain) plays its own whatever the cap, and one
    without a horizon of its own plays `cap` (docs/env.md, "horizon")."""
    checked = spec if isinstance(spec, WebTaskSpec) else check_env_spec(spec)
    if isinstance(checked, WebTaskSpec):
        return min(int(cap), checked.max_steps)
    entry = registered_entry(checked)
    if entry is not None:
        if entry.horizon is None:
            return int(cap)
        own = int(entry.horizon(checked.strip().partition("?")[2]))
        return own if not entry.takes_max_steps else min(int(cap), own)
    if isinstance(checked, str) and checked.startswith(MINIWOB_PREFIX):
        return min(int(cap), horizon(checked[len(MINIWOB_PREFIX):].partition("?")[0]))
    return int(cap)


def run_horizon(specs: list, cap: int) -> int:
    """The longest horizon of a run's tasks (`task_horizon` of each): what a buffer sized per episode must hold."""
    return max(task_horizon(spec, cap) for spec in specs)


def _make_checked(checked: Any, network, options: dict) -> Env:
    """The env of a checked spec; `network`: Chromium's emulated network conditions for a browser env, or None."""
    entry = registered_entry(checked)
    if entry is not None:
        if not entry.takes_browser:
            options.pop("browser", None)
        if not entry.takes_max_steps:
            options.pop("max_steps", None)
        return entry.factory(**options, **_spec_options(checked, entry))
    if network is not None:
        options["network"] = network
    if isinstance(checked, str):
        from jaxwebrl.env.tasks.miniwob import MiniWobEnv  # deferred (heavy): a browser env imports Selenium

        task, _, query = checked[len(MINIWOB_PREFIX):].partition("?")
        return MiniWobEnv(task, **options, **miniwob_options(query))
    from jaxwebrl.env.tasks.webtask import WebTaskEnv  # deferred (heavy), as above

    return WebTaskEnv(checked, **options)


def click_grid_size(spec: Any) -> tuple[int, int] | None:
    """(columns, rows) of the click grid an env spec declares (a MiniWoB++ task's `miniwob_tasks.CLICK_GRIDS`),
    None for the default grid (`jaxwebrl.env.agent.action_space.CLICK_GRID`)."""
    if isinstance(spec, str) and spec.strip().startswith(MINIWOB_PREFIX):
        return click_grid(spec.strip()[len(MINIWOB_PREFIX):].partition("?")[0])
    return None
