"""Headless Chromium under Selenium, hardened for untrusted pages and driven through CDP where it is faster.

One `Browser` is one Chromium with a fresh profile in its own temporary directory. Its concerns live in one module
each, and `Browser` puts them together:

  chromium.py         launching Chromium and chromedriver, the OS sandbox, the private profile, no orphans
  devtools.py         guarded WebDriver/CDP I/O: screenshots, clicks, keys, text, JavaScript (`DevToolsIO`)
  navigation.py       the allowlist and popup policy: where the page may go, one tab only (`NavigationPolicy`)
  browser_actions.py  an agent `Action` -> the browser calls that carry it out (`Browser.perform`)
  memory_bound.py     one memory bound on all a worker's browsers (a watchdog; a breach is a PageFault)
  request_guard.py, egress_proxy.py   every request (CDP Fetch) and every TCP connection (SOCKS5) checked against
                      the allowlist too

    with Browser(BrowserConfig(viewport=(1024, 768))) as browser:
        browser.set_allowlist(UrlAllowlist(["http://127.0.0.1:8000/*"]))
        browser.navigate("http://127.0.0.1:8000/index.html")
        info = browser.perform(action, area=(0, 0, 1024, 768))
        pixels = browser.screenshot()

Every WebDriver/CDP failure surfaces as `BrowserCrashed` or `EnvTimeout` (both `EnvFailure`); after one, the
browser is marked broken and `restart()` (or the env's next reset) starts a fresh one. docs/env.md has the
security model.
"""

from __future__ import annotations

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.browser import browser_actions
from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.browser.chromium import BrowserConfig, ChromiumProcess
from jaxwebrl.env.browser.devtools import DevToolsIO
from jaxwebrl.env.browser.egress_proxy import EgressProxy
from jaxwebrl.env.browser.navigation import NavigationPolicy
from jaxwebrl.env.browser.request_guard import RequestGuard


class Browser(DevToolsIO, NavigationPolicy):
    """One sandboxed headless Chromium. Not thread-safe: one caller at a time.

    All coordinates are CSS pixels of the pinned viewport unless a method says otherwise. `busy_s` counts the
    seconds inside WebDriver/CDP calls and `wait` actions (browser time vs caller time).
    """

    def __init__(self, config: BrowserConfig = BrowserConfig()):
        self.config = config
        self.allowlist = UrlAllowlist()
        self.process: ChromiumProcess | None = None
        self.driver = None
        self.broken = False
        self.request_guard: RequestGuard | None = None
        self.egress_proxy: EgressProxy | None = None
        self.busy_s = 0.0
        self.network = None   # emulated network conditions (`emulate_network`), applied again on every restart
        self.memory_breach: str | None = None   # set when the worker's memory bound killed it (memory_bound.py)
        self.start()

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Launch chromedriver + Chromium with a fresh profile and pin its viewport (and the emulated network,
        if any); the request guard and the egress proxy follow the current allowlist."""
        try:
            if self.config.egress_proxy:
                self.egress_proxy = EgressProxy(lambda: self.allowlist).start()
            self.process = ChromiumProcess(self.config, proxy_address=self.egress_proxy and self.egress_proxy.address)
            self.driver, self.broken, self.memory_breach = self.process.driver, False, None
            width, height = self.config.viewport
            self._cdp("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            try:
                self._cdp("Browser.setDownloadBehavior", {"behavior": "deny"})
            except EnvFailure:  # older Chromium: the download_restrictions pref still blocks downloads
                self.broken = False
            self._reset_navigation()
            if self.network is not None:
                self._apply_network()
            if self.config.guard_requests:
                address = self.driver.capabilities["goog:chromeOptions"]["debuggerAddress"]
                self.request_guard = RequestGuard(address, lambda url: self.allowlist.allows(url))
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return self.driver is not None and not self.broken

    @property
    def sandboxed(self) -> bool:
        return self.process is not None and self.process.sandboxed

    @property
    def sandbox_note(self) -> str:
        return "" if self.process is None else self.process.sandbox_note

    @property
    def profile_dir(self) -> str | None:
        """The browser's private temporary directory (profile, home, exposed task files); deleted on close."""
        return None if self.process is None else self.process.tmpdir

    def restart(self) -> None:
        """Kill whatever is left of this browser and start a fresh one (new profile), same allowlist."""
        allowlist = self.allowlist
        self.close()
        self.allowlist = allowlist
        self.start()

    def close(self) -> None:
        """Quit Chromium, kill any leftover process, delete the profile. Never raises."""
        guard, self.request_guard = self.request_guard, None
        proxy, self.egress_proxy = self.egress_proxy, None
        if guard is not None:
            guard.close()
        if proxy is not None:
            proxy.close()
        process, self.process = self.process, None
        if process is not None:
            process.close(quit_driver=not self.broken)
        self.driver = None

    def process_ids(self) -> list[int]:
        """chromedriver and every Chromium process under it (for crash tests and leak checks)."""
        return [] if self.process is None else self.process.process_ids()

    def chromium_pid(self) -> int | None:
        """The main Chromium browser process (child of chromedriver), or None."""
        return None if self.process is None else self.process.chromium_pid()

    def expose_directory(self, directory: str) -> str:
        """A path to `directory` that the browser user can read: itself, or a private read-only copy."""
        return self.process.expose_directory(directory)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- agent actions ----------------------------------------------------------------------------------
    def perform(self, action: Action, area: tuple[int, int, int, int], check_url: bool = True) -> dict:
        """Carry out `action` (0..1000 coordinates over `area` = (x, y, w, h) CSS px); see browser_actions.py."""
        return browser_actions.perform(self, action, area, check_url=check_url)
