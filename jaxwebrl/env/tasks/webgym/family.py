"""The WebGym family's record: "webgym:FILE.jsonl[?split=train|test]" in `env.tasks` expands to one spec
"webgym:FILE.jsonl:N" per task line (of that split); each plays as the JSON web task of `WebGymTask.web_spec`
(its difficulty's horizon under the run's cap), rewarded by the run's
judge (`env.py`, `judge.py`; the ground truth by default); a line that carries its `solution` has an oracle that
plays it (`oracle.py`: the bundled sites' tasks). A constrained policy's action texts are the default click grid
and `answer("<the answer the task's ground truth accepts>")`: over a run, a choice among all its tasks' answers."""

from __future__ import annotations

import re
import urllib.parse

from jaxwebrl.env.agent.action_space import CLICK_GRID
from jaxwebrl.env.agent.actions import Action, format_call

from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.env.tasks.webgym.oracle import plan_oracle
from jaxwebrl.env.tasks.webgym.webgym_tasks import load_task_line, task_lines
from jaxwebrl.env.tasks.webtask.task_spec import TaskSpecError, WebTaskSpec, text_matches

PREFIX = "webgym:"
_LINE = re.compile(r"(.+\.jsonl):(\d+)")


def _claims(spec) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def _file_and_split(entry: str) -> tuple[str, str | None]:
    """(path, split or None) of "webgym:FILE.jsonl[?split=...]"; TaskSpecError naming the fix."""
    path, _, query = entry[len(PREFIX):].partition("?")
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    if not path.endswith(".jsonl") or set(options) - {"split"}:
        raise TaskSpecError(f"webgym spec {entry!r}: use 'webgym:FILE.jsonl', 'webgym:FILE.jsonl?split=train|test' "
                            f"or one line 'webgym:FILE.jsonl:N'")
    return path, options.get("split")


def _expand(entry: str) -> list:
    if _LINE.fullmatch(entry[len(PREFIX):]):
        return [entry]
    path, split = _file_and_split(entry)
    return [f"{PREFIX}{path}:{number}" for number in task_lines(path, split)]


def _check(spec: str) -> WebTaskSpec:
    line = _LINE.fullmatch(spec[len(PREFIX):])
    if line is None:
        _file_and_split(spec)
        raise TaskSpecError(f"webgym task file {spec!r} holds one task per line: list it in env.tasks (or pass it "
                            f"through env_specs), or name one line as '{spec.partition('?')[0]}:N'")
    return load_task_line(line.group(1), int(line.group(2))).web_spec()


def _oracle(spec: WebTaskSpec):
    """The plan oracle of the task line `spec` came from, when the line carries a `solution`."""
    solution = _task_of(spec).extra.get("solution")
    return None if solution is None else plan_oracle(solution)


def _task_of(spec: WebTaskSpec):
    """The WebGym line `spec` was checked from."""
    path, _, number = spec.source.rpartition(":")
    return load_task_line(path, int(number))


def _action_texts(spec: WebTaskSpec) -> tuple[str, ...]:
    """The click grid and the answer the task's ground truth accepts: its answer, or with a regex ground truth the
    reference answer when the pattern accepts it (a rubric alone, or a pattern without one: clicks only)."""
    evaluator = spec.evaluator
    answer = evaluator.get("answer")
    if answer is not None and evaluator.get("mode") == "regex":
        reference = _task_of(spec).reference_answer
        accepted = reference is not None and text_matches(reference, answer, "regex",
                                                          bool(evaluator.get("case_sensitive", False)))
        answer = reference if accepted else None
    return CLICK_GRID + ((format_call(Action("answer", text=answer)),) if answer is not None else ())


def _make(spec: WebTaskSpec, *, judge=None, hand_off_verdicts: bool = False, **options):
    from jaxwebrl.env.tasks.webgym.env import WebGymEnv, judge_pool  # deferred (heavy): the env imports Selenium

    return WebGymEnv(spec, _task_of(spec), judge_pool(judge), hand_off_verdicts=hand_off_verdicts, **options)


WEBGYM = register_family(TaskFamily(
    name="webgym", claims=_claims, check=_check, make=_make, expand=_expand,
    horizon=lambda spec, cap: min(int(cap), spec.max_steps), oracle=_oracle, judged=True,
    action_texts=_action_texts))
