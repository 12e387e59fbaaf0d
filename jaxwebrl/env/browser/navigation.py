"""The allowlist and popup policy of a `Browser`: where its page may go, and one tab only (the Browser's mixin).

- `navigate(url)` outside the allowlist is refused before any request (`NavigationBlocked`, a task-level refusal);
- after each action, a page that ended up outside the allowlist (an error page for a blocked link) is replaced by
  the last allowed page (`enforce_allowlist`; the refused URL is reported as `info["navigation_blocked"]`);
- agents see one tab: popups are closed, and one whose URL the allowlist allows is loaded in the task's tab
  (`follow_popup`). With the request guard (request_guard.py) this costs nothing unless it saw a new tab.

Every request of every tab is also checked in the browser (`RequestGuard`) and every TCP connection by the egress
proxy (egress_proxy.py); this module is the page-level policy on top. The mixin uses the Browser's `allowlist`,
`request_guard`, `driver`, and its guarded calls (devtools.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from jaxwebrl.env.browser.allowlist import ALWAYS_ALLOWED_URLS, UrlAllowlist

log = logging.getLogger(__name__)

POPUP_URL_WAIT_S = 3.0  # a new tab reports about:blank until its navigation commits (seconds on a loaded machine)


class NavigationBlocked(ValueError):
    """A navigation target is outside the task's allowlist (a task-level refusal, not an EnvFailure)."""


class NavigationPolicy:
    """Allowlist enforcement and single-tab semantics (see the module docstring)."""

    allowlist: UrlAllowlist
    request_guard: Any
    driver: Any

    def _reset_navigation(self) -> None:
        """Forget the previous page and tabs (a freshly started browser)."""
        self._last_allowed_url = "about:blank"
        self._main_window = self.driver.current_window_handle
        self._popups_handled = 0

    def set_allowlist(self, allowlist: UrlAllowlist) -> None:
        self.allowlist = allowlist

    def navigate(self, url: str) -> None:
        """Load `url` and wait for it; NavigationBlocked if it is outside the allowlist."""
        if not self.allowlist.allows(url):
            raise NavigationBlocked(f"navigation to {url!r} is outside the task allowlist {list(self.allowlist.patterns)}")
        self._guard("navigate", self.driver.get, url)
        self.enforce_allowlist()

    def enforce_allowlist(self, url: str | None = None) -> str | None:
        """If the page (at `url`, read from the browser when None) left the allowlist, return to the last allowed
        page; returns the refused URL or None."""
        url = self.current_url() if url is None else url
        if self.allowlist.allows(url):
            self._last_allowed_url = url
            return None
        log.info("blocked navigation to %s; returning to %s", url, self._last_allowed_url)
        self._guard("navigate", self.driver.get, self._last_allowed_url)
        return url

    def close_popups(self) -> list[str]:
        """Close every tab but the task's own (agents see one tab); returns the closed tabs' URLs.

        With the request guard this costs nothing unless it saw a new tab; without it, one WebDriver call.
        """
        guard = self.request_guard
        if guard is not None and guard.popups_opened == self._popups_handled:
            return []
        if guard is not None:
            self._popups_handled = guard.popups_opened
        urls = []
        for handle in self._guard("window_handles", lambda: self.driver.window_handles):
            if handle != self._main_window:
                self._guard("switch_to.window", self.driver.switch_to.window, handle)
                urls.append(self._committed_url())
                self._guard("close", self.driver.close)
        if urls:
            self._guard("switch_to.window", self.driver.switch_to.window, self._main_window)
        return urls

    def follow_popup(self) -> str | None:
        """Single-tab semantics: a page the action opened in a new tab is closed and, when the allowlist allows
        its URL, loaded in the task's tab instead. Returns a refused popup URL, or None."""
        refused = None
        for url in self.close_popups():
            if url in ALWAYS_ALLOWED_URLS or not url:
                continue
            if self.allowlist.allows(url):
                self._guard("navigate", self.driver.get, url)
                refused = None
            else:
                refused = url
        return refused

    def _committed_url(self) -> str:
        """The current tab's URL once its first navigation has committed (bounded by POPUP_URL_WAIT_S): a popup
        read while still about:blank would be closed without being followed."""
        url, deadline = self.current_url(), time.monotonic() + POPUP_URL_WAIT_S
        while url in ("", "about:blank") and time.monotonic() < deadline:
            time.sleep(0.05)
            url = self.current_url()
        return url
