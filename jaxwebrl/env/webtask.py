"""User-supplied web tasks from JSON specs (WebGym-style): a start URL, a goal, a horizon and an evaluator.

    {"task_id": "shop/find-price", "start_url": "http://127.0.0.1:8000/index.html",
     "goal": "Find the price of the blue mug and answer with it.", "max_steps": 10, "difficulty": "easy",
     "evaluator": {"type": "answer_match", "answer": "12.50"},
     "allowlist": ["http://127.0.0.1:8000/*"]}                       # optional; default: start_url's origin

Evaluator types (`when` says whether it is checked after every step or only on `answer`/the last step):
- `js`:           {"expression": "<JS boolean expression>"}                                  when: step
- `url_match`:    {"pattern": "...", "mode": "exact" | "prefix" | "contains" | "regex" | "glob"}   when: step
- `text_match`:   {"text": "...", "selector": "body", "mode": "contains" | "exact" | "regex"}      when: step
- `answer_match`: {"answer": "...", "mode": "exact" | "contains" | "regex", "case_sensitive": false}  when: answer
- `python`:       {"function": "package.module.function" or "package.module:function"}         when: step
  called as `function(ctx: EvalContext) -> bool | float` (positive = success).
The reward is 1.0/0.0 for the built-in kinds and the returned float for `python`. A relative file start_url
in a .json file is resolved against that file's folder; file:// tasks may only reach their own folder.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import os
import re
import urllib.parse
from typing import Any, Callable

from jaxwebrl.env.actions import Action
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.allowlist import UrlAllowlist
from jaxwebrl.env.browser import Browser, BrowserConfig
from jaxwebrl.env.browser_env import BrowserEnv

SPEC_KEYS = {"task_id", "start_url", "goal", "max_steps", "difficulty", "evaluator", "allowlist", "viewport"}
REQUIRED_KEYS = ("task_id", "start_url", "goal", "evaluator")
DIFFICULTIES = ("easy", "medium", "hard")
EVALUATOR_KEYS = {
    "js": ({"expression"}, {"when"}),
    "url_match": ({"pattern"}, {"mode", "when"}),
    "text_match": ({"text"}, {"selector", "mode", "when", "case_sensitive"}),
    "answer_match": ({"answer"}, {"mode", "case_sensitive", "when"}),
    "python": ({"function"}, {"when", "args"}),
}
DEFAULT_VIEWPORT = (1024, 768)


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

    @classmethod
    def from_dict(cls, spec: dict, base_dir: str | None = None) -> "WebTaskSpec":
        """Validate a JSON task spec; ValueError names the bad key and says what is expected."""
        if not isinstance(spec, dict):
            raise ValueError(f"task spec must be a JSON object, got {type(spec).__name__}")
        unknown = set(spec) - SPEC_KEYS
        if unknown:
            raise ValueError(f"task spec has unknown keys {sorted(unknown)}; allowed: {sorted(SPEC_KEYS)}")
        missing = [k for k in REQUIRED_KEYS if k not in spec]
        if missing:
            raise ValueError(f"task spec is missing {missing}; required: {list(REQUIRED_KEYS)}")
        for key in ("task_id", "start_url", "goal"):
            if not isinstance(spec[key], str) or not spec[key].strip():
                raise ValueError(f"task spec {key!r} must be a non-empty string, got {spec[key]!r}")
        max_steps = spec.get("max_steps", 10)
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"task spec 'max_steps' must be a positive integer, got {max_steps!r}")
        difficulty = spec.get("difficulty", "medium")
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"task spec 'difficulty' must be one of {DIFFICULTIES}, got {difficulty!r}")
        viewport = tuple(spec.get("viewport", DEFAULT_VIEWPORT))
        if len(viewport) != 2 or not all(isinstance(v, int) and v > 0 for v in viewport):
            raise ValueError(f"task spec 'viewport' must be [width, height] in pixels, got {spec.get('viewport')!r}")
        allowlist = spec.get("allowlist", ())
        if isinstance(allowlist, str) or not all(isinstance(p, str) for p in allowlist):
            raise ValueError(f"task spec 'allowlist' must be a list of URL patterns, got {allowlist!r}")
        return cls(task_id=spec["task_id"], start_url=_resolve_start_url(spec["start_url"], base_dir),
                   goal=spec["goal"], evaluator=_check_evaluator(spec["evaluator"]), max_steps=max_steps,
                   difficulty=difficulty, allowlist=tuple(allowlist), viewport=viewport)


def _resolve_start_url(url: str, base_dir: str | None) -> str:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme in ("http", "https", "file"):
        return url
    if scheme:
        raise ValueError(f"task spec 'start_url' must be http(s):// or file://, got {url!r}")
    path = url if os.path.isabs(url) else os.path.join(base_dir or os.getcwd(), url)
    return "file://" + urllib.parse.quote(os.path.abspath(path))


def _check_evaluator(evaluator: Any) -> dict:
    if not isinstance(evaluator, dict) or evaluator.get("type") not in EVALUATOR_KEYS:
        raise ValueError(f"task spec 'evaluator' must be an object with type in {sorted(EVALUATOR_KEYS)}, "
                         f"got {evaluator!r}")
    required, optional = EVALUATOR_KEYS[evaluator["type"]]
    keys = set(evaluator) - {"type"}
    if required - keys:
        raise ValueError(f"{evaluator['type']} evaluator needs {sorted(required - keys)}")
    if keys - required - optional:
        raise ValueError(f"{evaluator['type']} evaluator has unknown keys {sorted(keys - required - optional)}; "
                         f"allowed: {sorted(required | optional)}")
    when = evaluator.get("when", "answer" if evaluator["type"] == "answer_match" else "step")
    if when not in ("step", "answer"):
        raise ValueError(f"evaluator 'when' must be 'step' or 'answer', got {when!r}")
    if evaluator["type"] == "python":
        load_function(evaluator["function"])  # fail before any browser starts
    if "mode" in evaluator:
        modes = {"url_match": ("exact", "prefix", "contains", "regex", "glob"),
                 "text_match": ("contains", "exact", "regex"),
                 "answer_match": ("exact", "contains", "regex")}[evaluator["type"]]
        if evaluator["mode"] not in modes:
            raise ValueError(f"{evaluator['type']} mode must be one of {modes}, got {evaluator['mode']!r}")
    return {**evaluator, "when": when}


def load_function(dotted: str) -> Callable:
    """Import `package.module.function` or `package.module:function`; ValueError says what failed."""
    if not isinstance(dotted, str) or not re.fullmatch(r"[\w.]+(:[\w.]+)?", dotted or ""):
        raise ValueError(f"python evaluator 'function' must be a dotted name like 'pkg.mod.fn', got {dotted!r}")
    module_name, _, attr = dotted.partition(":") if ":" in dotted else dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"python evaluator {dotted!r} needs a module: 'pkg.mod.fn'")
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"python evaluator {dotted!r}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise ValueError(f"python evaluator {dotted!r}: {attr!r} is not a function in {module_name!r}")
    return target


@dataclasses.dataclass
class EvalContext:
    """What a python evaluator sees: the spec, the page URL, the agent's answer (or None) and page access."""

    spec: WebTaskSpec
    url: str
    answer: str | None
    run_js: Callable[..., Any]
    args: dict

    def page_text(self, selector: str = "body") -> str:
        return self.run_js("var el = document.querySelector(arguments[0]); return el ? el.innerText : '';",
                           selector) or ""


def _text_matches(value: str, target: str, mode: str, case_sensitive: bool) -> bool:
    if not case_sensitive:
        value, target = value.lower(), target.lower()
    value, target = " ".join(value.split()), " ".join(target.split())
    if mode == "exact":
        return value == target
    if mode == "contains":
        return target in value
    return re.search(target, value, 0 if case_sensitive else re.IGNORECASE) is not None


class WebTaskEnv(BrowserEnv):
    """A JSON-spec web task in its own (or a shared) browser; screenshots show the whole pinned viewport."""

    def __init__(self, spec: WebTaskSpec, *, screenshot_size: tuple[int, int] | None = None,
                 max_steps: int | None = None, browser: Browser | None = None,
                 browser_config: BrowserConfig | None = None):
        super().__init__(max_steps=max_steps if max_steps is not None else spec.max_steps,
                         screenshot_size=screenshot_size, browser=browser,
                         browser_config=browser_config or BrowserConfig(viewport=spec.viewport))
        self.spec = spec
        self.task_id = spec.task_id
        self.area = (0, 0, *spec.viewport)
        self._python_eval = load_function(spec.evaluator["function"]) if spec.evaluator["type"] == "python" else None
        self._start_url = spec.start_url

    def _allowlist(self, browser: Browser) -> UrlAllowlist:
        parts = urllib.parse.urlsplit(self.spec.start_url)
        if parts.scheme == "file":
            task_dir = os.path.dirname(urllib.parse.unquote(parts.path))
            exposed = browser.expose_directory(task_dir)
            self._start_url = "file://" + urllib.parse.quote(exposed) + "/" + os.path.basename(parts.path)
            if parts.query:
                self._start_url += "?" + parts.query
            return UrlAllowlist.for_directory(exposed, extra=self.spec.allowlist)
        default = () if self.spec.allowlist else (f"{parts.scheme}://{parts.netloc}/*",)
        return UrlAllowlist([*default, *self.spec.allowlist])

    def _start_episode(self, browser: Browser, seed: int) -> str:
        """Load the start page (web tasks are deterministic; `seed` only names the episode)."""
        browser.set_allowlist(self._allowlist(browser))
        browser.navigate(self._start_url)
        return self.spec.goal

    def _judge(self, action: Action, last_step: bool) -> tuple[float, bool, dict]:
        """Evaluate after every step (when="step"), or only on answer / the last step (when="answer")."""
        answered = action.kind == "answer"
        when = self.spec.evaluator["when"]
        evaluated = when == "step" or answered or last_step
        reward = self.evaluate(action.text if answered else None) if evaluated else 0.0
        success = reward > 0
        return reward, answered or (when == "step" and success), {"success": success, "evaluated": evaluated}

    def evaluate(self, answer: str | None) -> float:
        """The evaluator's reward for the current page (and the agent's answer, when given)."""
        ev = self.spec.evaluator
        kind, case = ev["type"], bool(ev.get("case_sensitive", False))
        browser = self.browser
        if kind == "js":
            return float(bool(browser.run_js(f"return !!({ev['expression']});")))
        if kind == "url_match":
            url, pattern, mode = browser.current_url(), ev["pattern"], ev.get("mode", "exact")
            ok = {"exact": lambda: url == pattern, "prefix": lambda: url.startswith(pattern),
                  "contains": lambda: pattern in url, "regex": lambda: re.search(pattern, url) is not None,
                  "glob": lambda: fnmatch.fnmatchcase(url, pattern)}[mode]()
            return float(ok)
        if kind == "text_match":
            text = browser.run_js("var el = document.querySelector(arguments[0]); return el ? el.innerText : null;",
                                  ev.get("selector", "body"))
            return float(text is not None and _text_matches(text, ev["text"], ev.get("mode", "contains"), case))
        if kind == "answer_match":
            return float(answer is not None and _text_matches(answer, ev["answer"], ev.get("mode", "exact"), case))
        ctx = EvalContext(spec=self.spec, url=browser.current_url(), answer=answer, run_js=browser.run_js,
                          args=dict(ev.get("args", {})))
        try:
            return float(self._python_eval(ctx))
        except EnvFailure:
            raise
        except Exception as exc:
            raise RuntimeError(f"{self.task_id}: python evaluator {ev['function']!r} failed: {exc}") from exc
