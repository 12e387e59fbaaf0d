"""The JSON web-task family's record: a dict, JSON text, a .json file, line N of a .jsonl task set
("FILE.jsonl:N"; the set itself in `env.tasks` expands to its lines) or a directory of such files; the spec's own
`max_steps` under the run's cap; the default click grid; no oracle (a spec carries an evaluator, not a solution)."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.env.tasks.webtask.task_spec import TaskSpecError, WebTaskSpec, load_spec_file, load_spec_line, spec_lines

JSONL_SUFFIX = ".jsonl"   # a task set: one JSON task spec per line
_JSONL_LINE = re.compile(r"(.+\.jsonl):(\d+)")   # its line N as an env spec
_SCHEME = re.compile(r"[A-Za-z][\w-]*:")   # "webgym:FILE.jsonl" and other families' "<name>:..." specs


def _claims(spec: Any) -> bool:
    if isinstance(spec, (Mapping, WebTaskSpec)):
        return True
    if not isinstance(spec, str) or _SCHEME.match(spec):
        return False
    return spec.startswith("{") or spec.endswith((".json", JSONL_SUFFIX)) or bool(_JSONL_LINE.fullmatch(spec)) \
        or os.path.isdir(spec)


def _check(spec: Any) -> WebTaskSpec:
    if isinstance(spec, WebTaskSpec):
        return spec
    if isinstance(spec, Mapping):
        return WebTaskSpec.from_dict(dict(spec))
    if spec.startswith("{"):
        try:
            data = json.loads(spec)
        except (ValueError, RecursionError) as err:
            raise TaskSpecError(f"task spec (inline JSON text): not valid JSON ({err}): fix the text") from None
        return WebTaskSpec.from_dict(data)
    if spec.endswith(".json"):
        return load_spec_file(spec)
    line = _JSONL_LINE.fullmatch(spec)
    if line:
        return load_spec_line(line.group(1), int(line.group(2)))
    if spec.endswith(JSONL_SUFFIX):
        raise ValueError(f"task set {spec!r} holds one spec per line: list it in env.tasks (or pass it through "
                         f"env_specs), or name one line as '{spec}:N'")
    raise ValueError(f"task set {spec!r} is a directory: list it in env.tasks (or pass it through env_specs), or "
                     f"name one of its files")


def _expand(entry: str) -> list:
    if entry.endswith(JSONL_SUFFIX):
        return [f"{entry}:{number}" for number in spec_lines(entry)]
    if os.path.isdir(entry):
        return _directory_specs(entry)
    return [entry]


def _directory_specs(directory: str) -> list:
    names = sorted(n for n in os.listdir(directory) if n.endswith((".json", JSONL_SUFFIX))
                   and os.path.isfile(os.path.join(directory, n)))
    if not names:
        raise TaskSpecError(f"task set {directory}: no .json or .jsonl task spec files in it: add some, or name "
                            "the files themselves")
    out: list = []
    for name in names:
        path = os.path.join(directory, name)
        out.extend([f"{path}:{n}" for n in spec_lines(path)] if name.endswith(JSONL_SUFFIX) else [path])
    return out


def _make(spec: WebTaskSpec, **options):
    from jaxwebrl.env.tasks.webtask.webtask import WebTaskEnv  # deferred (heavy): a browser env imports Selenium

    return WebTaskEnv(spec, **options)


WEBTASK = register_family(TaskFamily(
    name="webtask", claims=_claims, check=_check, make=_make, expand=_expand,
    horizon=lambda spec, cap: min(int(cap), spec.max_steps)))
