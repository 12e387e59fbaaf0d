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
import os
import re
import urllib.parse
from typing import Any, Callable

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.base import EnvFailure, PageScriptError, TaskSpecFault
from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.tasks.browser_env import BrowserEnv
from jaxwebrl.env.tasks.webtask.task_spec import (DEFAULT_VIEWPORT, TaskSpecError, WebTaskSpec, load_function,  # noqa: F401
                                    load_spec_file, normalise_text, task_allowlist, text_matches)


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


class WebTaskEnv(BrowserEnv):
    """A JSON-spec web task in its own (or a shared) browser; screenshots show the whole pinned viewport."""

    def __init__(self, spec: WebTaskSpec, *, screenshot_size: tuple[int, int] | None = None,
                 max_steps: int | None = None, browser: Browser | None = None,
                 browser_config: BrowserConfig | None = None, network=None):
        super().__init__(max_steps=max_steps if max_steps is not None else spec.max_steps,
                         screenshot_size=screenshot_size, browser=browser,
                         browser_config=browser_config or BrowserConfig(viewport=spec.viewport), network=network)
        self.spec = spec
        self.task_id = spec.task_id
        self.area = (0, 0, *spec.viewport)
        self._python_eval = self._python_evaluator() if spec.evaluator["type"] == "python" else None
        self._start_url = spec.start_url

    def _allowlist(self, browser: Browser) -> UrlAllowlist:
        parts = urllib.parse.urlsplit(self.spec.start_url)
        if parts.scheme == "file":
            task_dir = os.path.dirname(urllib.parse.unquote(parts.path))
            exposed = browser.expose_directory(task_dir)
            self._start_url = "file://" + urllib.parse.quote(exposed) + "/" + os.path.basename(parts.path)
            if parts.query:
                self._start_url += "?" + parts.query
            return task_allowlist(self._start_url, self.spec.allowlist, directory=exposed)
        return task_allowlist(self.spec.start_url, self.spec.allowlist)

    def _start_episode(self, browser: Browser, seed: int) -> str:
        """Load the start page (web tasks are deterministic; `seed` only names the episode)."""
        browser.set_allowlist(self._allowlist(browser))
        browser.navigate(self._start_url)
        browser.check_loaded(self._start_url, source=self.spec.start_url)   # not loaded: a PageFault naming it
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
        if kind == "judge":
            raise TaskSpecFault(f"task spec {self.spec.source or self.task_id}: its reward is a judge's verdict, "
                                f"which this env has none of: play it as a WebGym task (webgym:FILE.jsonl, env.judge)")
        browser = self.browser
        if kind == "js":
            try:
                return float(bool(browser.run_js(f"return !!({ev['expression']});")))
            except PageScriptError as exc:
                raise self._evaluator_fault(f"js evaluator {ev['expression']!r}", exc) from exc
        if kind == "url_match":
            url, pattern, mode = browser.current_url(), ev["pattern"], ev.get("mode", "exact")
            ok = {"exact": lambda: url == pattern, "prefix": lambda: url.startswith(pattern),
                  "contains": lambda: pattern in url, "regex": lambda: re.search(pattern, url) is not None,
                  "glob": lambda: fnmatch.fnmatchcase(url, pattern)}[mode]()
            return float(ok)
        if kind == "text_match":
            text = browser.run_js("var el = document.querySelector(arguments[0]); return el ? el.innerText : null;",
                                  ev.get("selector", "body"))
            return float(text is not None and text_matches(text, ev["text"], ev.get("mode", "contains"), case))
        if kind == "answer_match":
            return float(answer is not None and text_matches(answer, ev["answer"], ev.get("mode", "exact"), case))
        ctx = EvalContext(spec=self.spec, url=browser.current_url(), answer=answer, run_js=browser.run_js,
                          args=dict(ev.get("args", {})))
        try:
            return float(self._python_eval(ctx))
        except EnvFailure as exc:
            if not isinstance(exc, PageScriptError):   # the browser broke under it
                raise
            raise self._evaluator_fault(f"python evaluator {ev['function']!r}", exc) from exc
        except Exception as exc:
            raise self._evaluator_fault(f"python evaluator {ev['function']!r}", exc) from exc

    def _python_evaluator(self):
        """The spec's python evaluator, imported in this worker; a name that does not import as a function defined
        in its module is the spec's fault (TaskSpecFault, one line), not a crash of the worker."""
        try:
            return load_function(self.spec.evaluator["function"])
        except ValueError as exc:
            raise TaskSpecFault(f"task spec {self.spec.source or self.task_id}: {exc}: fix its evaluator's "
                                f"'function'") from None

    def _evaluator_fault(self, evaluator: str, exc: BaseException) -> TaskSpecFault:
        """The one-line TaskSpecFault of an evaluator that raised: the spec (its file), the evaluator, the error."""
        message = " ".join(str(exc).split())[:300]
        return TaskSpecFault(f"task spec {self.spec.source or self.task_id}: its {evaluator} raised "
                             f"{type(exc).__name__}: {message}: fix the evaluator")
