"""The MiniWoB++ family's record: specs "miniwob/<task>[?reward=strict]" ("miniwob" alone in `env.tasks`: every
bundled task), the split's horizon, the task's declared click grid, a scripted oracle per task that has one."""

from __future__ import annotations

from jaxwebrl.env.agent.action_space import click_grid as grid_texts
from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.env.tasks.miniwob.miniwob_tasks import available_tasks, click_grid, horizon, miniwob_options

PREFIX = "miniwob/"
ALL = "miniwob"   # in env.tasks: every bundled MiniWoB++ task


def _task(spec: str) -> tuple[str, str]:
    """(task name, options text) of "miniwob/<task>?<options>"."""
    task, _, query = spec[len(PREFIX):].partition("?")
    return task, query


def _claims(spec) -> bool:
    return isinstance(spec, str) and (spec == ALL or spec.startswith(PREFIX))


def _check(spec: str) -> str:
    if spec == ALL:
        raise ValueError("'miniwob' names every bundled task: list it in env.tasks (or pass it through env_specs), "
                         "or name one task as 'miniwob/<task>'")
    task, query = _task(spec)
    if task not in available_tasks():
        raise ValueError(f"unknown MiniWoB++ task {spec!r}: see the miniwob package's html/miniwob/*.html")
    miniwob_options(query)
    return spec


def _make(spec: str, **options):
    from jaxwebrl.env.tasks.miniwob.miniwob import MiniWobEnv  # deferred (heavy): a browser env imports Selenium

    task, query = _task(spec)
    return MiniWobEnv(task, **options, **miniwob_options(query))


def _action_texts(spec: str):
    size = click_grid(_task(spec)[0])
    return None if size is None else grid_texts(*size)


def _oracle(spec: str):
    from jaxwebrl.env.tasks.miniwob.oracles import ORACLES  # deferred (heavy): the oracles import Selenium

    oracle = ORACLES.get(_task(spec)[0])
    return None if oracle is None else (lambda env, observation, step: oracle(env))


def _doctor_specs() -> list:
    from jaxwebrl.env.tasks.miniwob.oracles import oracle_tasks  # deferred (heavy), as above

    return [PREFIX + task for task in oracle_tasks()]


MINIWOB = register_family(TaskFamily(
    name="miniwob", claims=_claims, check=_check, make=_make,
    expand=lambda entry: [PREFIX + task for task in available_tasks()] if entry == ALL else [entry],
    horizon=lambda spec, cap: min(int(cap), horizon(_task(spec)[0])), action_texts=_action_texts,
    shares_browser=True, oracle=_oracle, doctor_specs=_doctor_specs))
