"""JSON web-task specs, validated completely before any browser starts (`WebTaskSpec.from_dict`, `load_spec_file`).

    {"task_id": "shop/find-price", "start_url": "http://127.0.0.1:8000/index.html",
     "goal": "Find the price of the blue mug and answer with it.", "max_steps": 10, "difficulty": "easy",
     "evaluator": {"type": "answer_match", "answer": "12.50"},
     "allowlist": ["http://127.0.0.1:8000/*"], "viewport": [1024, 768]}

Checked: known keys only; types (a number where text is expected, or null, is a named error, not a TypeError);
ranges (max_steps in 1..MAX_STEPS, each viewport side in VIEWPORT_RANGE px); allowlist patterns are URL
patterns and the start URL is inside the task's own allowlist; evaluator fields, and every regex compiles with
the flags it will be used with. Every problem is one `TaskSpecError` line naming the file (or task), the key
and the fix, e.g. `task spec shop.json: 'viewport'=[0, 10]: each side must be an int in 64..4096 px ...`.

A task set is a `.jsonl` file of such specs, one per line (blank lines are skipped); line N is the env spec
`FILE.jsonl:N` (`spec_lines`, `load_spec_line`), and its errors name `FILE.jsonl:N`.

Python evaluators are named, never imported here (a spec is data; importing runs code): `load_function`
imports one when a worker builds the env. Rule for what may be named: "package.module.function" or
"package.module:function" where the module is not part of Python's standard library (so no `os.system`,
`subprocess.run`, `builtins.eval`, ...), the function name is one identifier without a leading underscore, and,
once imported, it is a plain Python function defined in that module (not a builtin, not re-exported from
elsewhere). The top-level package must be importable (found, not imported) on this machine.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import urllib.parse
from typing import Any, Callable

from jaxwebrl.env.browser.allowlist import UrlAllowlist

SPEC_KEYS = ("task_id", "start_url", "goal", "max_steps", "difficulty", "evaluator", "allowlist", "viewport")
REQUIRED_KEYS = ("task_id", "start_url", "goal", "evaluator")
DIFFICULTIES = ("easy", "medium", "hard")
MAX_STEPS = 1000
VIEWPORT_RANGE = (64, 4096)
DEFAULT_VIEWPORT = (1024, 768)
MAX_ALLOWLIST_PATTERNS = 256
EVALUATOR_KEYS = {
    "js": ({"expression"}, {"when"}),
    "url_match": ({"pattern"}, {"mode", "when"}),
    "text_match": ({"text"}, {"selector", "mode", "when", "case_sensitive"}),
    "answer_match": ({"answer"}, {"mode", "case_sensitive", "when"}),
    "python": ({"function"}, {"when", "args"}),
    "judge": (set(), set()),   # the reward is a judge's verdict on the episode (a WebGym rubric: env.judge)
}
EVALUATOR_MODES = {"url_match": ("exact", "prefix", "contains", "regex", "glob"),
                   "text_match": ("contains", "exact", "regex"),
                   "answer_match": ("exact", "contains", "regex")}
_TEXT_FIELD = {"js": "expression", "url_match": "pattern", "text_match": "text", "answer_match": "answer",
               "python": "function"}
_FUNCTION_NAME = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)[.:]([A-Za-z_]\w*)")
_REFUSED_TOP_LEVEL = frozenset(sys.stdlib_module_names) | {"builtins", "__main__"}


def max_steps_problem(steps) -> str | None:
    """What is wrong with an episode's step budget (a spec's max_steps, a run's env.max_episode_steps), or None."""
    if type(steps) is int and 1 <= steps <= MAX_STEPS:
        return None
    return f"must be an int in 1..{MAX_STEPS} (the episode's step budget, e.g. 10)"


class TaskSpecError(ValueError):
    """A bad task spec; the message is one line naming the spec, the key and the fix."""


@dataclasses.dataclass(frozen=True)
class WebTaskSpec:
    task_id: str
    start_url: str
    goal: str
    evaluator: dict
    max_steps: int = 10
    difficulty: str = "medium"
    allowlist: tuple[str, ...] = ()
    viewport: tuple[int, int] = DEFAULT_VIEWPORT
    source: str | None = dataclasses.field(default=None, compare=False)   # the file (or FILE.jsonl:N) it came from

    @classmethod
    def from_dict(cls, spec: Any, base_dir: str | None = None, source: str | None = None) -> "WebTaskSpec":
        """Validate a JSON task spec (see module docstring); TaskSpecError names `source` (a file), the key and the
        fix. A relative start_url is resolved against `base_dir`."""
        where = source or (spec.get("task_id") if isinstance(spec, dict) and isinstance(spec.get("task_id"), str)
                           else "(inline)")

        def fail(key: str, value: Any, fix: str) -> None:
            raise TaskSpecError(f"task spec {where}: {key!r}={short_repr(value)}: {fix}")

        if not isinstance(spec, dict):
            raise TaskSpecError(f"task spec {where} must be a JSON object, got {type(spec).__name__}")
        unknown = sorted(set(spec) - set(SPEC_KEYS), key=str)
        if unknown:
            fail(unknown[0], spec[unknown[0]], f"unknown key; the keys are {list(SPEC_KEYS)}")
        missing = [k for k in REQUIRED_KEYS if k not in spec]
        if missing:
            raise TaskSpecError(f"task spec {where} is missing {missing}; required: {list(REQUIRED_KEYS)}")
        for key in ("task_id", "start_url", "goal"):
            if not isinstance(spec[key], str) or not spec[key].strip():
                fail(key, spec[key], "must be a non-empty string")
        max_steps = spec.get("max_steps", 10)
        steps_fix = max_steps_problem(max_steps)
        if steps_fix is not None:
            fail("max_steps", max_steps, steps_fix)
        difficulty = spec.get("difficulty", "medium")
        if difficulty not in DIFFICULTIES:
            fail("difficulty", difficulty, f"must be one of {list(DIFFICULTIES)}")
        viewport = spec.get("viewport", list(DEFAULT_VIEWPORT))
        low, high = VIEWPORT_RANGE
        if (not isinstance(viewport, (list, tuple)) or len(viewport) != 2
                or not all(type(v) is int and low <= v <= high for v in viewport)):
            fail("viewport", viewport, f"must be [width, height] with each side an int in {low}..{high} px, "
                                       "e.g. [1024, 768]")
        allowlist = spec.get("allowlist", [])
        if (not isinstance(allowlist, list) or len(allowlist) > MAX_ALLOWLIST_PATTERNS
                or not all(isinstance(p, str) for p in allowlist)):
            fail("allowlist", allowlist, f"must be a list of at most {MAX_ALLOWLIST_PATTERNS} URL patterns, "
                                         "e.g. ['http://127.0.0.1:8000/*']")
        try:
            UrlAllowlist(allowlist)
        except ValueError as err:
            fail("allowlist", allowlist, str(err))
        try:
            start_url = resolve_start_url(spec["start_url"], base_dir)
        except ValueError as err:
            fail("start_url", spec["start_url"], str(err))
        if not task_allowlist(start_url, tuple(allowlist)).allows(start_url):
            fail("start_url", spec["start_url"], f"is outside the task's own allowlist {allowlist}: add a pattern "
                                                 "that covers it, e.g. its origin followed by /*")
        try:
            evaluator = check_evaluator(spec["evaluator"])
        except ValueError as err:
            raise TaskSpecError(f"task spec {where}: 'evaluator': {err}") from None
        return cls(task_id=spec["task_id"], start_url=start_url, goal=spec["goal"], evaluator=evaluator,
                   max_steps=max_steps, difficulty=difficulty, allowlist=tuple(allowlist), viewport=tuple(viewport),
                   source=source)


def load_spec_file(path: str) -> WebTaskSpec:
    """Read and validate a .json task spec; TaskSpecError names the file for a missing file or bad JSON too."""
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except OSError as err:
        raise TaskSpecError(f"task spec {path}: cannot read it ({err.strerror}): give an existing .json file") from None
    except (ValueError, RecursionError) as err:
        raise TaskSpecError(f"task spec {path}: not valid JSON ({short_repr(err, 120)}): fix the file") from None
    return WebTaskSpec.from_dict(spec, base_dir=os.path.dirname(os.path.abspath(path)), source=path)


def spec_lines(path: str) -> list[int]:
    """The 1-based numbers of the non-blank lines of a .jsonl task set (one task spec per line)."""
    return [number for number, line in enumerate(read_lines(path), 1) if line.strip()]


def load_spec_line(path: str, number: int) -> WebTaskSpec:
    """Read and validate line `number` (1-based) of a .jsonl task set; TaskSpecError names `path:number`."""
    where = f"{path}:{number}"
    lines = read_lines(path)
    if not 1 <= number <= len(lines) or not lines[number - 1].strip():
        raise TaskSpecError(f"task spec {where}: no task spec on that line ({path} has {len(lines)} lines)")
    try:
        spec = json.loads(lines[number - 1])
    except (ValueError, RecursionError) as err:
        raise TaskSpecError(f"task spec {where}: not valid JSON ({short_repr(err, 120)}): one JSON object per line, "
                            "fix that line") from None
    return WebTaskSpec.from_dict(spec, base_dir=os.path.dirname(os.path.abspath(path)), source=where)


def read_lines(path: str) -> list[str]:
    """The lines of a task file (read once per modification); TaskSpecError naming it when it cannot be read."""
    try:
        stat = os.stat(path)
        return list(_cached_lines(os.path.abspath(path), stat.st_mtime_ns, stat.st_size))
    except OSError as err:
        raise TaskSpecError(f"task set {path}: cannot read it ({err.strerror}): give an existing .jsonl file "
                            "(one task spec per line)") from None
    except UnicodeDecodeError as err:
        raise TaskSpecError(f"task set {path}: not UTF-8 text ({short_repr(err, 80)}): save it as UTF-8") from None


@functools.lru_cache(maxsize=8)
def _cached_lines(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    """The file's lines, read once per (path, modification): validating N lines reads the file once."""
    del mtime_ns, size   # cache keys only
    with open(path, encoding="utf-8") as f:
        return tuple(f.read().splitlines())


def resolve_start_url(url: str, base_dir: str | None) -> str:
    """http(s)/file URLs as they are; a relative or absolute path becomes a file:// URL (against `base_dir`). A local
    page must exist (ValueError naming the missing file or folder)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("http", "https"):
        if not parts.hostname or "@" in parts.netloc:
            raise ValueError("an http(s) start_url needs a host and no user:password@, e.g. http://127.0.0.1:8000/")
        try:
            parts.port
        except ValueError:
            raise ValueError("the port must be a number, e.g. http://127.0.0.1:8000/index.html") from None
        return url
    if parts.scheme == "file":
        _check_page_exists(urllib.parse.unquote(parts.path))
        return url
    if parts.scheme and len(parts.scheme) > 1:  # (a one-letter scheme is a Windows drive)
        raise ValueError("must be http(s):// or file://, or a path to an .html file")
    path = os.path.abspath(url if os.path.isabs(url) else os.path.join(base_dir or os.getcwd(), url))
    _check_page_exists(path)
    return "file://" + urllib.parse.quote(path)


def _check_page_exists(path: str) -> None:
    """ValueError naming the missing file (or its missing folder) of a local start page."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ValueError(f"the page's folder {folder} does not exist: fix the path or create the page there")
    if not os.path.isfile(path):
        raise ValueError(f"the file {path} does not exist: fix the path or create the page")


def task_allowlist(start_url: str, patterns: tuple[str, ...], directory: str | None = None) -> UrlAllowlist:
    """The allowlist a task runs under: file:// tasks get their folder (`directory`, default the start page's)
    plus `patterns`; web tasks get `patterns`, or the start URL's origin when there are none."""
    parts = urllib.parse.urlsplit(start_url)
    if parts.scheme == "file":
        folder = directory or os.path.dirname(urllib.parse.unquote(parts.path))
        return UrlAllowlist.for_directory(folder, extra=patterns)
    return UrlAllowlist(patterns or (f"{parts.scheme}://{parts.netloc}/*",))


def normalise_text(text: str, case_sensitive: bool) -> str:
    """What text/answer evaluators compare: whitespace collapsed, lower-cased unless case-sensitive."""
    text = " ".join(text.split())
    return text if case_sensitive else text.lower()


def text_matches(value: str, target: str, mode: str, case_sensitive: bool) -> bool:
    """Whether `value` matches `target` under `mode` (exact, contains, regex), both normalised first (a regex keeps
    its case: IGNORECASE does the rest, where lower-casing would turn \\S into \\s and \\Z into a bad escape)."""
    value, target = normalise_text(value, case_sensitive), normalise_text(target, case_sensitive or mode == "regex")
    if mode == "exact":
        return value == target
    if mode == "contains":
        return target in value
    return re.search(target, value, 0 if case_sensitive else re.IGNORECASE) is not None


def check_evaluator(evaluator: Any) -> dict:
    """The evaluator with its `when` filled in; ValueError (one line, naming the field) when it is malformed."""
    if not isinstance(evaluator, dict) or evaluator.get("type") not in EVALUATOR_KEYS:
        raise ValueError(f"must be an object with type in {sorted(EVALUATOR_KEYS)}, got {short_repr(evaluator)}")
    kind = evaluator["type"]
    required, optional = EVALUATOR_KEYS[kind]
    keys = set(evaluator) - {"type"}
    if required - keys:
        raise ValueError(f"a {kind} evaluator needs {sorted(required - keys)}")
    if keys - required - optional:
        raise ValueError(f"a {kind} evaluator has unknown keys {sorted(keys - required - optional, key=str)}; "
                         f"allowed: {sorted(required | optional)}")
    if kind == "judge":   # nothing of the page is evaluated: the episode ends on an answer or its last step
        return {**evaluator, "when": "answer"}
    text = evaluator[_TEXT_FIELD[kind]]
    if not isinstance(text, str) or (kind in ("js", "python") and not text.strip()):
        raise ValueError(f"{_TEXT_FIELD[kind]!r}={short_repr(text)} must be a {'non-empty ' if kind in ('js', 'python') else ''}"
                         "string")
    when = evaluator.get("when", "answer" if kind == "answer_match" else "step")
    if when not in ("step", "answer"):
        raise ValueError(f"'when'={short_repr(when)} must be 'step' or 'answer'")
    case_sensitive = evaluator.get("case_sensitive", False)
    if type(case_sensitive) is not bool:
        raise ValueError(f"'case_sensitive'={short_repr(case_sensitive)} must be true or false")
    if not isinstance(evaluator.get("selector", "body"), str):
        raise ValueError(f"'selector'={short_repr(evaluator['selector'])} must be a CSS selector string")
    if "mode" in evaluator and evaluator["mode"] not in EVALUATOR_MODES.get(kind, ()):
        raise ValueError(f"{kind} 'mode'={short_repr(evaluator['mode'])} must be one of {EVALUATOR_MODES[kind]}")
    if evaluator.get("mode") == "regex":
        pattern = text if kind == "url_match" else normalise_text(text, case_sensitive)
        try:
            re.compile(pattern, 0 if kind == "url_match" or case_sensitive else re.IGNORECASE)
        except re.error as err:
            raise ValueError(f"{_TEXT_FIELD[kind]!r}={short_repr(text)} is not a valid regex ({err})") from None
    if kind == "python":
        check_function_name(text)
        if not isinstance(evaluator.get("args", {}), dict):
            raise ValueError(f"'args'={short_repr(evaluator['args'])} must be a JSON object (the function sees ctx.args)")
    return {**evaluator, "when": when}


def check_function_name(dotted: str) -> tuple[str, str]:
    """(module, function) of a python evaluator's name under the module docstring's rule; nothing is imported."""
    match = _FUNCTION_NAME.fullmatch(dotted)
    if not match:
        raise ValueError(f"python evaluator 'function'={dotted!r} must name a function as 'package.module.function' "
                         "or 'package.module:function'")
    module, function = match.groups()
    top = module.split(".")[0]
    if top in _REFUSED_TOP_LEVEL:
        raise ValueError(f"python evaluator 'function'={dotted!r}: functions of Python's standard library ({top}) "
                         "are refused; write a function fn(ctx) -> bool | float in your own module")
    if function.startswith("_"):
        raise ValueError(f"python evaluator 'function'={dotted!r}: private names are refused; name a public function")
    if importlib.util.find_spec(top) is None:
        raise ValueError(f"python evaluator 'function'={dotted!r}: no package {top!r} on this machine's path; "
                         "install it or add its folder to PYTHONPATH")
    return module, function


def load_function(dotted: str) -> Callable:
    """Import a python evaluator (in the worker that runs the task); ValueError when it breaks the rule."""
    module_name, function = check_function_name(dotted)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"python evaluator {dotted!r}: cannot import {module_name!r} ({exc})") from None
    target = getattr(module, function, None)
    home = getattr(target, "__module__", None)
    if not inspect.isfunction(target) or home != module.__name__:
        got = type(target).__name__ + (f" from {home}" if home and home != module.__name__ else "")
        raise ValueError(f"python evaluator {dotted!r} must be a Python function defined in {module_name!r} "
                         f"(got {got})")
    return target


def short_repr(value: Any, limit: int = 80) -> str:
    """A value (or an error) as one line of at most `limit` characters, for error messages."""
    text = " ".join(repr(value).split()) if not isinstance(value, BaseException) else " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
