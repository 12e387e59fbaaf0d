"""The allowlist and popup policy of a `Browser`: where its page may go, and one tab only (the Browser's mixin).

- `navigate(url)` outside the allowlist is refused before any request (`NavigationBlocked`, a task-level refusal);
- after each action, a page that ended up outside the allowlist (an error page for a blocked link) is replaced by
  the last allowed page (`enforce_allowlist`; the refused URL is reported as `info["navigation_blocked"]`);
- agents see one tab: popups are closed, and one whose URL the allowlist allows is loaded in the task's tab
  (`follow_popup`). With the request guard (request_guard.py) this costs nothing unless it saw a new tab.
- what only a faulty page does ends its episode as a `PageFault` (env-failed, naming the reason): a page that
  opens more than MAX_POPUPS windows between two looks (window.open without end), one that leaves its allowed
  origin before any allowed page held (the start page navigates away at once: there is nothing to return to but
  about:blank), and a start page that does not load (`check_loaded`: a network error page or an HTTP error).

Every request of every tab is also checked in the browser (`RequestGuard`) and every TCP connection by the egress
proxy (egress_proxy.py); this module is the page-level policy on top. The mixin uses the Browser's `allowlist`,
`request_guard`, `driver`, and its guarded calls (devtools.py).
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from typing import Any

from jaxwebrl.env.base import PageFault
from jaxwebrl.env.browser.allowlist import ALWAYS_ALLOWED_URLS, UrlAllowlist

log = logging.getLogger(__name__)

POPUP_URL_WAIT_S = 3.0  # a new tab reports about:blank until its navigation commits (seconds on a loaded machine)
MAX_POPUPS = 8          # windows a page may open between two looks (each action's, each screenshot's)
LOAD_CHECK_JS = ("var n = performance.getEntriesByType('navigation')[0];"
                 "return [location.href, n && n.responseStatus ? n.responseStatus : 0];")


class NavigationBlocked(ValueError):
    """A navigation target is outside the task's allowlist (a task-level refusal, not an EnvFailure)."""


class PageNotLoaded(PageFault):
    """The page navigated to did not load (a network error; `reason` is Chromium's): the task's fault when it is
    the start page, the agent's (an action error, browser_actions.py) when its own `navigate` went there."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


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
        """The allowlist of the next pages (a task's; its episode starts): an earlier task's page is no place to
        return to."""
        self.allowlist = allowlist
        self._last_allowed_url = "about:blank"

    def navigate(self, url: str) -> None:
        """Load `url` and wait for it; NavigationBlocked if it is outside the allowlist."""
        if not self.allowlist.allows(url):
            raise NavigationBlocked(f"navigation to {url!r} is outside the task allowlist {list(self.allowlist.patterns)}")
        try:
            self._guard("navigate", self.driver.get, url)
        except PageFault as exc:
            reason = str(exc).partition(": ")[2].removesuffix(" (the page did not load)")
            message = f"the page {url} did not load ({reason}); start its server or fix the URL"
            if self.broken:   # the tab crashed or the memory bound killed the browser: not the URL's doing
                raise PageFault(message) from exc
            raise PageNotLoaded(message, reason) from exc
        self.enforce_allowlist()

    def enforce_allowlist(self, url: str | None = None) -> str | None:
        """If the page (at `url`, read from the browser when None) left the allowlist, return to the last allowed
        page; returns the refused URL or None."""
        url = self.current_url() if url is None else url
        if self.allowlist.allows(url):
            self._last_allowed_url = url
            return None
        if self._last_allowed_url in ALWAYS_ALLOWED_URLS:
            raise PageFault(f"the page left its allowed origin for {url} before any allowed page held (only "
                            f"about:blank to return to): its task cannot be played; fix the task's page")
        log.info("blocked navigation to %s; returning to %s", url, self._last_allowed_url)
        self._guard("navigate", self.driver.get, self._last_allowed_url)
        return url

    def close_popups(self) -> list[str]:
        """Close every tab but the task's own (agents see one tab); returns the closed tabs' URLs (each once its
        first navigation committed, bounded by POPUP_URL_WAIT_S). Through CDP targets: WebDriver's window switch
        blocks on a page that keeps opening windows. More than MAX_POPUPS since the last look is a PageFault.

        With the request guard this costs nothing unless it saw a new tab; without it, one CDP call.
        """
        guard = self.request_guard
        if guard is not None and guard.popups_opened == self._popups_handled:
            return []
        opened = 0
        if guard is not None:
            opened, self._popups_handled = guard.popups_opened - self._popups_handled, guard.popups_opened
        popups = self._popup_urls()
        opened = max(opened, len(popups))
        if opened > MAX_POPUPS:
            self.broken = True   # its windows keep coming: the next episode starts a fresh browser
            raise PageFault(f"the page opened {opened} windows since the last look (at most {MAX_POPUPS}): a page "
                            f"that opens windows without end ends its episode")
        deadline = time.monotonic() + POPUP_URL_WAIT_S
        while any(url in ("", "about:blank") for url in popups.values()) and time.monotonic() < deadline:
            time.sleep(0.05)   # a new tab reports about:blank until its navigation commits
            popups.update({k: v for k, v in self._popup_urls().items() if k in popups})
        for target in popups:
            self._guard("Target.closeTarget", _close_target, self.driver, target)
        return list(popups.values())

    def _popup_urls(self) -> dict[str, str]:
        """{CDP target id (= WebDriver window handle): URL} of every page tab but the task's own."""
        targets = self._guard("Target.getTargets", self.driver.execute_cdp_cmd, "Target.getTargets", {})
        return {t["targetId"]: t.get("url", "") for t in targets.get("targetInfos", [])
                if t.get("type") == "page" and t["targetId"] != self._main_window}

    def check_loaded(self, url: str, source: str | None = None) -> None:
        """PageFault naming `url` when the page just navigated to did not load: Chromium's network error page
        (connection refused, unknown host, missing file) or an HTTP status >= 400. `source`: the task's own URL of a
        file:// page the browser reads from a private copy (`expose_directory`), named instead of the copy."""
        href, status = self._guard("execute_script", self.driver.execute_script, LOAD_CHECK_JS)
        if str(href).startswith("chrome-error:"):
            history = self._cdp("Page.getNavigationHistory")   # its entry names the URL whose load failed
            failed = history["entries"][history["currentIndex"]]["url"]
            if failed != url and not self.allowlist.allows(failed):
                raise PageFault(f"the page {url} left its allowed origin for {failed} at once (blocked, nothing "
                                f"to play): fix the task's page")
            raise PageFault(not_loaded_message(url, source or url))
        if int(status or 0) >= 400:
            raise PageFault(f"the page {url} did not load (HTTP status {int(status)}); fix the URL or its server")

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


def not_loaded_message(url: str, source: str) -> str:
    """Why `url` (the task's `source`, or a private copy of it) showed Chromium's error page, in one line: a file://
    page that is not there (its folder named when that is missing too), else a network error."""
    parts = urllib.parse.urlsplit(source)
    if parts.scheme != "file":
        return f"the page {url} did not load (a network error: nothing answered there); start its server or fix the URL"
    path = urllib.parse.unquote(parts.path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return f"the page {source} did not load: its folder {folder} does not exist; fix the task's start_url"
    if not os.path.isfile(path):
        return (f"the page {source} did not load: the file {path} does not exist; fix the task's start_url or "
                f"create the file")
    return f"the page {source} did not load: the browser could not read the file {path}; check its permissions"


def _close_target(driver, target: str) -> None:
    """CDP Target.closeTarget; a tab that already closed itself is no error."""
    try:
        driver.execute_cdp_cmd("Target.closeTarget", {"targetId": target})
    except Exception as exc:  # noqa: BLE001 - re-raised unless the tab is simply gone (the guard maps it)
        if "no target" not in str(exc).lower():
            raise
