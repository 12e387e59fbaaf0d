"""The `chain` task family in real Chromium: a local page (pages/chain.html, file://) redrawn every step.

    env = make_env("chain/medium-recall?trap=1", screenshot_size=(64, 64))   # = ChainEnv("chain/medium-recall", trap=1)
    obs = env.reset(seed=3)           # obs.goal = "Press red, blue, ...", the 160 x 160 page
    res = env.step("click(450, 250)")  # a real click; the page reports what it hit, `ChainEpisode` judges it

The rules, variants and instances are `jaxwebrl.env.tasks.chain.chain_tasks` (no browser). The page is served like
MiniWoB++'s: its folder is exposed to the browser and the allowlist confines it to that folder; it is loaded once
per browser and redrawn by JavaScript. The horizon is the spec's own (`horizon=`), so `make_env` leaves a run's
`max_steps` out. StepResult.info holds `event` (advance / wrong / back / trap / miss / success) and `progress`;
neither reaches the agent (no `action_error`: a recall page must not tell it how far it got).
"""

from __future__ import annotations

import os

import numpy as np

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.base import Observation
from jaxwebrl.env.browser.allowlist import blocked_message
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.tasks.browser_env import LocalPageEnv
from jaxwebrl.env.tasks.chain.chain_tasks import (BACK_LINK, COLOUR_RGB, PAGE_SIZE, SLOTS, ChainEpisode, chain_spec,
                                            strip_cells)
from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT

PAGES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pages")
PAGE_NAME = "chain.html"
_HITS_JS = "var hits = window.chainHits || []; window.chainHits = []; return [hits, location.href];"


class ChainEnv(LocalPageEnv):
    """One chain spec in one browser (owned, or shared via `browser=`; a shared one is not closed).

    name: a registered chain name ("chain/easy", "chain/hard-recall", ...); trap, horizon, layout: its options.
    screenshot_size: (W, H) to resize the 160 x 160 page to, or None for native pixels.
    `last_screenshot` is the latest observation's screenshot (what the agent saw; the oracle reads it).
    """

    area = (0, 0, *PAGE_SIZE)
    judge_checks_url = True

    def __init__(self, name: str, *, trap: int = 0, horizon: int | None = None, layout: str = "shuffled",
                 screenshot_size: tuple[int, int] | None = None, browser: Browser | None = None,
                 browser_config: BrowserConfig | None = None, network=None):
        self.spec = chain_spec(name, trap=trap, horizon=horizon, layout=layout)
        super().__init__(max_steps=self.spec.horizon, screenshot_size=screenshot_size, browser=browser,
                         browser_config=browser_config or BrowserConfig(viewport=VIEWPORT), network=network)
        self.task_id = self.task = self.spec.name
        self.episode: ChainEpisode | None = None
        self.last_screenshot: np.ndarray | None = None

    @property
    def steps_taken(self) -> int:
        return self._steps

    def _start_episode(self, browser: Browser, seed: int) -> str:
        self._open_local_page(browser, PAGES_DIR, PAGE_NAME)
        self.episode = ChainEpisode(self.spec, seed)
        self._render()
        return self.episode.goal

    def _render(self) -> None:
        """Draw the episode's current page (its layout, the variant's progress strip, the back link)."""
        episode = self.episode
        slots = [None if item is None else [list(box), list(COLOUR_RGB[item]), item]
                 for box, item in zip(SLOTS, episode.layout())]
        strip = [[list(box), list(rgb)] for box, rgb in zip(strip_cells(self.spec.presses), episode.strip())]
        self.browser.run_js("window.chainHits = []; render(arguments[0]);",
                            {"slots": slots, "strip": strip, "back": list(BACK_LINK)})

    def _judge(self, action: Action, last_step: bool) -> tuple[float, bool, dict]:
        """What the click hit (the page's record), judged by the episode's rules; then the next page."""
        hits, href = self.browser.run_js(_HITS_JS)
        info: dict = {}
        blocked = self.browser.enforce_allowlist(href)
        if blocked:
            info.update(navigation_blocked=blocked, action_error=blocked_message(blocked))
        event = self.episode.press(hits[-1] if hits else None)
        if not self.episode.over:
            if self.browser.current_url().split("#")[0] != self._url:   # go_back / navigate left the page
                self.browser.navigate(self._url)
            self._render()
        success = event == "success"
        info.update(event=event, progress=self.episode.progress, success=success)
        return float(success), self.episode.over or action.kind == "answer", info

    def _observe(self) -> Observation:
        obs = super()._observe()
        self.last_screenshot = obs.screenshot
        return obs
