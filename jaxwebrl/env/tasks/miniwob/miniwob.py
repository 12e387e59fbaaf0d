"""MiniWoB++ tasks from the installed `miniwob` package, played in a real headless Chromium via file:// URLs.

    env = MiniWobEnv("click-test")                 # or make_env("miniwob/click-test")
    obs = env.reset(seed=3)                        # goal = the task's utterance, screenshot of the task area
    res = env.step('<tool_call>{"name": "computer_use", "arguments": {"action": "click", "coordinate": [500, 400]}}</tool_call>')

Episodes are reset by the page's own JavaScript (`core.endEpisode`, `Math.seedrandom`, `core.startEpisodeReal`)
without reloading, with `core.EPISODE_MAX_TIME` raised to ~24 days so a slow policy is never timed out by the
page (its 10 s default gives -1). The reward is read from `WOB_RAW_REWARD_GLOBAL` once `WOB_DONE_GLOBAL` is set:
"binary" (default) gives 1.0 for a positive raw reward and 0.0 otherwise; "strict" 1.0 only for raw == 1 (a
perfect answer: a checkbox task's partial answer is a failure); "raw" passes the page's value through.
Screenshots are the 160 x 210 task area (`#wrap`), resized to `screenshot_size` (W, H) when given; action
coordinates (0..1000) refer to that area.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from jaxwebrl.env.agent.actions import Action, from_viewport
from jaxwebrl.env.base import EnvTimeout
from jaxwebrl.env.browser.allowlist import blocked_message
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.tasks.browser_env import LocalPageEnv
from jaxwebrl.env.tasks.miniwob.miniwob_tasks import REWARDS, available_tasks, click_grid, horizon, html_dir, task_split

TASK_AREA = (0, 0, 160, 210)  # x, y, width, height of #wrap in CSS pixels
VIEWPORT = (320, 240)  # room for the task area; the reward display to its right is never captured
MAX_EPISODE_TIME_MS = 2**31 - 1  # setTimeout's largest delay; larger values overflow and fire at once

_STATE_JS = """
if (typeof WOB_DONE_GLOBAL === 'undefined') { return [false, 0, null, location.href]; }  // not a task page
return [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON, location.href];
"""
_START_JS = """
core.EPISODE_MAX_TIME = arguments[1];
if (core.EP_TIMER !== null) { core.endEpisode(0, false, 'reset'); }
Math.seedrandom(arguments[0]);
core.startEpisodeReal();
return [WOB_TASK_READY, core.getUtterance()];
"""
_VISIBLE_POINT_JS = """
// A point inside the element that really hits it (not covered by another element), centre first.
var el = arguments[0];
if (typeof el === 'string') { el = document.querySelector(el); }
if (!el) { return null; }
var r = el.getBoundingClientRect();
if (r.width === 0 || r.height === 0) { return null; }
var fractions = [0.5, 0.3, 0.7, 0.15, 0.85], xs = [arguments[1]].concat(fractions);
for (var i = 0; i < fractions.length; i++) {
  for (var j = 0; j < xs.length; j++) {
    var x = r.left + r.width * xs[j], y = r.top + r.height * fractions[i];
    var hit = document.elementFromPoint(x, y);
    if (hit && (hit === el || el.contains(hit) || hit.contains(el) && hit.tagName === 'LABEL')) { return [x, y]; }
  }
}
return [r.left + r.width * arguments[1], r.top + r.height / 2];
"""
_GRID_POINT_JS = """
// The centre of a columns x rows grid cell over the task area that hits the element, nearest its centre.
var el = arguments[0], cols = arguments[1], rows = arguments[2], w = arguments[3], h = arguments[4];
if (typeof el === 'string') { el = document.querySelector(el); }
if (!el) { return null; }
var r = el.getBoundingClientRect(), cx = r.left + r.width / 2, cy = r.top + r.height / 2, best = null, dist = 0;
for (var j = 0; j < rows; j++) {
  for (var i = 0; i < cols; i++) {
    var x = (2 * i + 1) * w / (2 * cols), y = (2 * j + 1) * h / (2 * rows);
    if (x < r.left || x > r.right || y < r.top || y > r.bottom) { continue; }
    var hit = document.elementFromPoint(x, y);
    if (!hit || !(hit === el || el.contains(hit) || hit.contains(el) && hit.tagName === 'LABEL')) { continue; }
    var d = (x - cx) * (x - cx) + (y - cy) * (y - cy);
    if (best === null || d < dist) { best = [i, j]; dist = d; }
  }
}
return best;
"""


@dataclasses.dataclass(frozen=True)
class MiniWobSpec:
    """What a rollout worker reads of the task: `difficulty`, the split the evaluation report files it under."""

    task: str
    reward: str
    difficulty: str


class MiniWobEnv(LocalPageEnv):
    """One MiniWoB++ task in one browser (owned, or shared via `browser=`; a shared one is not closed).

    screenshot_size: (W, H) to resize the 160 x 210 task area to, or None for native pixels.
    max_steps: horizon; defaults to the task's split horizon.
    reward: "binary" (1.0 on positive raw reward, else 0.0), "strict" (1.0 on raw == 1 only) or "raw" (the
        page's value, in [-1, 1]); a reward other than "binary" is part of `task_id` ("...?reward=strict").
    click_grid: (columns, rows) of the task's declared click grid (`miniwob_tasks.CLICK_GRIDS`), or None.
    network: Chromium's emulated network conditions (`latency.NetworkConditions`) or None (see BrowserEnv).
    """

    area = TASK_AREA
    judge_checks_url = True

    def __init__(self, task: str, *, screenshot_size: tuple[int, int] | None = None, max_steps: int | None = None,
                 reward: str = "binary", browser: Browser | None = None, browser_config: BrowserConfig | None = None,
                 ready_timeout_s: float = 5.0, network=None):
        path = os.path.join(html_dir(), "miniwob", f"{task}.html")
        if not os.path.isfile(path):
            near = [t for t in available_tasks() if task.split("-")[0] in t][:8]
            raise ValueError(f"unknown MiniWoB++ task {task!r} (no {path}); similar: {near}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        super().__init__(max_steps=max_steps if max_steps is not None else horizon(task),
                         screenshot_size=screenshot_size, browser=browser,
                         browser_config=browser_config or BrowserConfig(viewport=VIEWPORT), network=network)
        self.task = task
        self.task_id = f"miniwob/{task}" + ("" if reward == "binary" else f"?reward={reward}")
        self.reward_mode = reward
        self.click_grid = click_grid(task)
        self.spec = MiniWobSpec(task, reward, task_split(task) or "other")
        self.ready_timeout_s = ready_timeout_s

    def _start_episode(self, browser: Browser, seed: int) -> str:
        """Load the page once per browser, then reset by the page's own JS (same seed -> same instance)."""
        self._seed = seed
        self._open_local_page(browser, html_dir(), f"miniwob/{self.task}.html")
        ready, utterance = browser.run_js(_START_JS, str(seed), MAX_EPISODE_TIME_MS)
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready:
            if time.monotonic() > deadline:
                raise EnvTimeout(f"{self.task_id}: WOB_TASK_READY stayed false for {self.ready_timeout_s} s")
            time.sleep(0.02)
            ready, utterance = browser.run_js("return [WOB_TASK_READY, core.getUtterance()];")
        return utterance

    def _judge(self, action: Action, last_step: bool) -> tuple[float, bool, dict]:
        """The page's verdict (one JS call that also returns the URL for the allowlist check). Another page of the
        folder (a `go_back` to the task a shared browser played before, a `navigate`) is never judged: the task page
        returns with its instance restarted."""
        done, raw_reward, reason, href = self.browser.run_js(_STATE_JS)
        info: dict = {}
        blocked = self.browser.enforce_allowlist(href)
        if blocked:
            info.update(navigation_blocked=blocked, action_error=blocked_message(blocked))
        elif href.split("#")[0] != self._url:
            done = False
            self._start_episode(self.browser, self._seed)
            info.update(action_error=f"the action left the task page for {href}; returned to it (the task restarts)")
        raw_reward = float(raw_reward) if done else 0.0
        wins = raw_reward >= 1.0 if self.reward_mode == "strict" else raw_reward > 0
        reward = raw_reward if self.reward_mode == "raw" else float(wins)
        info.update(raw_reward=raw_reward, reason=reason, success=bool(done) and wins)
        return reward, bool(done) or action.kind == "answer", info

    def element_point(self, element: Any, x_fraction: float = 0.5) -> tuple[int, int] | None:
        """0..1000 action coordinates of a visible point of an element (a CSS selector or a WebElement), or None
        if absent or not rendered; relative to the task area the screenshot shows. The point is at `x_fraction`
        of the width and mid-height unless covered there (e.g. 0.2 avoids a number field's spin buttons)."""
        center = self.run_js(_VISIBLE_POINT_JS, element, x_fraction)
        if center is None:
            return None
        x0, y0, width, height = TASK_AREA
        return from_viewport(center[0] - x0, center[1] - y0, width, height)

    def grid_point(self, element: Any, grid: tuple[int, int]) -> tuple[int, int] | None:
        """0..1000 coordinates of the (columns, rows) grid cell centre that hits the element nearest its centre
        (the very text `action_space.click_grid` lists), or None when no grid point hits it."""
        columns, rows = grid
        x0, y0, width, height = TASK_AREA
        cell = self.run_js(_GRID_POINT_JS, element, columns, rows, width, height)
        if cell is None:
            return None
        return (2 * cell[0] + 1) * 1000 // (2 * columns), (2 * cell[1] + 1) * 1000 // (2 * rows)
