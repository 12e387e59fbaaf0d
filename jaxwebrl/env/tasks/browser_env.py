"""What every browser-backed environment shares: owning or borrowing a Browser, restarting it after an
EnvFailure, the step skeleton (parse -> perform -> judge -> observe), horizons and timings.

A subclass says where the task lives and how it is scored:
    _start_episode(browser, seed) -> str      load/reset the task, return the goal
    _judge(action, last_step) -> (reward, terminated, info)
    area                                       (x, y, w, h) CSS px that screenshots and 0..1000 coordinates cover
"""

from __future__ import annotations

import time
from typing import Any

from jaxwebrl.env.agent.actions import Action, parse_action
from jaxwebrl.env.base import Observation, StepResult
from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig


class BrowserEnv:
    """Base of MiniWobEnv and WebTaskEnv (implements the `Env` protocol of base.py).

    browser: a Browser to share (not closed by `close`), or None to own one made from `browser_config`.
    network: Chromium's emulated network conditions (`latency.NetworkConditions`, the "web" latency regime) or
        None; set on the browser (owned or shared) whenever the env uses it, so a restarted browser keeps them.
    timings: seconds per "reset", "screenshot" and "action" (action = perform + judge), appended per call.
    """

    task_id: str
    area: tuple[int, int, int, int]
    judge_checks_url = False  # True: _judge runs browser.enforce_allowlist itself (saves a round trip)

    def __init__(self, *, max_steps: int, screenshot_size: tuple[int, int] | None, browser: Browser | None,
                 browser_config: BrowserConfig, network=None):
        if screenshot_size is not None and (len(screenshot_size) != 2 or min(screenshot_size) <= 0):
            raise ValueError(f"screenshot_size must be (width, height) > 0, got {screenshot_size!r}")
        if int(max_steps) < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
        self.max_steps = int(max_steps)
        self.screenshot_size = tuple(screenshot_size) if screenshot_size is not None else None
        self.browser = browser
        self._owns_browser = browser is None
        self._browser_config = browser_config
        self._network = network
        self._goal = ""
        self._steps = 0
        self._episode_over = True
        self.timings: dict[str, list[float]] = {"reset": [], "screenshot": [], "action": []}

    # ---- subclass hooks ---------------------------------------------------------------------------------
    def _start_episode(self, browser: Browser, seed: int) -> str:
        raise NotImplementedError

    def _judge(self, action: Action, last_step: bool) -> tuple[float, bool, dict]:
        raise NotImplementedError

    def _page_url(self) -> str:
        return self.browser.current_url()

    # ---- Env interface ----------------------------------------------------------------------------------
    def ensure_browser(self) -> Browser:
        """The env's browser, started on first use and restarted after an EnvFailure broke it."""
        if self.browser is None:
            self.browser = Browser(self._browser_config)
        elif not self.browser.alive:
            self.browser.restart()
        if self._network is not None:
            self.browser.emulate_network(self._network)
        return self.browser

    def reset(self, seed: int) -> Observation:
        """Start an episode (EnvFailure if the browser broke; the next reset starts a fresh one)."""
        t0 = time.perf_counter()
        self._episode_over = True
        self._goal = self._start_episode(self.ensure_browser(), seed)
        self._steps, self._episode_over = 0, False
        self.timings["reset"].append(time.perf_counter() - t0)
        return self._observe()

    def step(self, action: Action | str) -> StepResult:
        """Execute one action (model text is parsed; invalid text is a no-op step with `action_error`)."""
        if self._episode_over:
            raise RuntimeError(f"{self.task_id}: step() after the episode ended; call reset(seed) first")
        if isinstance(action, str):
            action = parse_action(action)
        browser = self.ensure_browser()
        self._steps += 1
        info: dict[str, Any] = {"step": self._steps, "invalid_action": not action.is_valid,
                                "action_error": action.error, "navigation_blocked": None}
        t0 = time.perf_counter()
        if action.is_valid and action.kind != "answer":
            info.update(browser.perform(action, self.area, check_url=not self.judge_checks_url))
        last_step = self._steps >= self.max_steps
        reward, terminated, judged = self._judge(action, last_step)
        self.timings["action"].append(time.perf_counter() - t0)
        info.update(judged)
        truncated = not terminated and last_step
        self._episode_over = terminated or truncated
        return StepResult(self._observe(), float(reward), bool(terminated), truncated, info)

    def close(self) -> None:
        """Close an owned browser (a shared one stays open). Never raises."""
        if self._owns_browser and self.browser is not None:
            self.browser.close()
            self.browser = None

    # ---- observation and page access --------------------------------------------------------------------
    def _observe(self) -> Observation:
        t0 = time.perf_counter()
        shot = self.browser.screenshot(self.area, self.screenshot_size)
        self.timings["screenshot"].append(time.perf_counter() - t0)
        return Observation(goal=self._goal, screenshot=shot, url=self._page_url(),
                           info={"task": self.task_id, "step": self._steps})

    def run_js(self, script: str, *args) -> Any:
        """Run JavaScript in the task page (`return ...` for a value)."""
        return self.ensure_browser().run_js(script, *args)

    @property
    def goal(self) -> str:
        return self._goal

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalPageEnv(BrowserEnv):
    """A BrowserEnv whose task is one local page (MiniWoB++, chain): loaded once per browser from an exposed
    directory the tab is confined to, then reset in place by the page's own JS; the observation's url is that page."""

    _url: str | None = None   # the page this env loaded into its browser (None until then, or after a failed load)

    def _page_url(self) -> str:
        return self._url or ""

    def _open_local_page(self, browser: Browser, directory: str, page: str) -> None:
        """Expose `directory`, confine the tab to it, and load `page` (a path inside it) unless the tab shows it."""
        root = browser.expose_directory(directory)
        browser.set_allowlist(UrlAllowlist.for_directory(root))
        url = f"file://{root}/{page}"
        if self._url != url or browser.current_url().split("#")[0] != url:
            self._url = None
            browser.navigate(url)
            self._url = url
