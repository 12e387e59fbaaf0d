"""DevTools I/O of a `Browser`: every WebDriver/CDP call guarded, pixels out, input in (the `Browser`'s mixin).

Screenshots use CDP `Page.captureScreenshot` (clipped, no WebDriver round trip for the element), input uses CDP
`Input.dispatchMouseEvent` / `Input.insertText` / `Input.dispatchKeyEvent`; coordinates are CSS pixels of the
viewport the browser pinned. Every WebDriver/CDP failure surfaces as `BrowserCrashed` or `EnvTimeout` (both
`EnvFailure`) and marks the browser broken (its `restart()`, or the env's next reset, starts a fresh one), except
what the page caused: script that threw is a `PageScriptError` (the browser stays up), and a tab that crashed under
the renderer memory limit (`BrowserConfig.memory_limit_mb`) a `PageFault` naming the limit, and so is every failure
of a browser the worker's memory bound killed (`memory_breach`, set by memory_bound.py).

The mixin uses the Browser's `driver`, `broken`, `busy_s` (seconds inside browser calls), `network` (the
emulated network conditions, kept across restarts) and `memory_breach`, and its `close_popups()` (navigation.py)
before a capture.
"""

from __future__ import annotations

import base64
import io
import time
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from jaxwebrl.env.base import BrowserCrashed, EnvFailure, EnvTimeout, PageFault, PageScriptError
from jaxwebrl.env.browser.keys import key_events

# After an input action: two animation frames (wheel scrolls and layout land), at most 150 ms where frames stall.
SETTLE_JS = "new Promise(r => { requestAnimationFrame(() => requestAnimationFrame(r)); setTimeout(r, 150); })"


class DevToolsIO:
    """Guarded WebDriver/CDP calls, screenshots and input (see the module docstring)."""

    driver: Any
    broken: bool
    busy_s: float
    network: Any   # jaxwebrl.env.latency.NetworkConditions or None
    memory_breach: str | None   # why the worker's memory bound killed this browser (memory_bound.py), or None

    def _guard(self, what: str, fn: Callable, *args, **kwargs):
        """Run a WebDriver call; map every driver/browser failure to EnvFailure and mark the browser broken (a
        PageFault naming the bound when the worker's memory bound killed it)."""
        try:
            return self._guarded_call(what, fn, *args, **kwargs)
        except EnvFailure as exc:
            if not self.memory_breach:
                raise
            self.broken = True
            raise PageFault(f"{what}: {self.memory_breach}") from exc

    def _guarded_call(self, what: str, fn: Callable, *args, **kwargs):
        if self.driver is None or self.broken:
            raise BrowserCrashed(f"browser is not running (call restart()) before {what}")
        from selenium.common.exceptions import (JavascriptException, TimeoutException,  # deferred: Selenium is heavy
                                                WebDriverException)

        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except TimeoutException as exc:
            self.broken = True
            raise EnvTimeout(f"{what}: browser timed out ({_first_line(exc)})") from exc
        except JavascriptException as exc:   # the page's script threw: the browser is fine
            raise PageScriptError(f"{what}: the page's script threw: {_first_line(exc)}") from exc
        except WebDriverException as exc:
            if "net::ERR_" in _first_line(exc):   # a page that did not load (refused, unknown host): not a crash
                raise PageFault(f"{what}: {_first_line(exc)} (the page did not load)") from exc
            self.broken = True
            limit = getattr(getattr(self, "config", None), "memory_limit_mb", None)
            if limit and "tab crashed" in _first_line(exc):
                raise PageFault(f"{what}: the page's tab crashed, most likely at the renderer memory limit of "
                                f"{limit} MB a Chromium process (BrowserConfig.memory_limit_mb; "
                                f"{_first_line(exc)})") from exc
            raise BrowserCrashed(f"{what}: {_first_line(exc)}") from exc
        except Exception as exc:  # urllib3/socket errors: chromedriver is gone or hung
            self.broken = True
            text = f"{type(exc).__name__}: {_first_line(exc)}"
            if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
                raise EnvTimeout(f"{what}: chromedriver did not answer ({text})") from exc
            raise BrowserCrashed(f"{what}: chromedriver unreachable ({text})") from exc
        finally:
            self.busy_s += time.perf_counter() - t0

    def _cdp(self, cmd: str, params: dict | None = None) -> dict:
        return self._guard(cmd, self.driver.execute_cdp_cmd, cmd, params or {})

    def run_js(self, script: str, *args) -> Any:
        """Run JavaScript in the page (`return ...` to get a value)."""
        return self._guard("execute_script", self.driver.execute_script, script, *args)

    def current_url(self) -> str:
        return self._guard("current_url", lambda: self.driver.current_url)

    def go_back(self) -> None:
        self._guard("back", self.driver.back)

    def settle(self) -> None:
        """Let the page apply an input action before anything reads its state: CDP input calls return once the
        event is dispatched, while scrolling, new tabs and layout complete on later frames."""
        self._cdp("Runtime.evaluate", {"expression": SETTLE_JS, "awaitPromise": True})

    # ---- network conditions ------------------------------------------------------------------------------
    def emulate_network(self, conditions) -> None:
        """Throttle the page's network like `conditions` (a `latency.NetworkConditions`: CDP
        `Network.emulateNetworkConditions`; None: the real network). Kept for every later restart."""
        if conditions == self.network:
            return
        self.network = conditions
        self._apply_network()

    def _apply_network(self) -> None:
        """Send `network` to the page (after a start, or when it changed)."""
        if self.network is None:
            self._cdp("Network.emulateNetworkConditions",
                      {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
            return
        self._cdp("Network.enable")
        self._cdp("Network.emulateNetworkConditions", self.network.cdp_params())

    # ---- pixels -----------------------------------------------------------------------------------------
    def screenshot(self, clip: tuple[int, int, int, int] | None = None,
                   size: tuple[int, int] | None = None) -> np.ndarray:
        """uint8 [H, W, 3] RGB of the viewport, or of clip=(x, y, width, height); resized to size=(W, H)."""
        self.close_popups()  # a tab in front of the task's would stall the capture
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": False, "optimizeForSpeed": True}
        if clip is not None:
            x, y, w, h = clip
            params["clip"] = {"x": x, "y": y, "width": w, "height": h, "scale": 1}
        data = self._cdp("Page.captureScreenshot", params)["data"]
        image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
        if size is not None and image.size != tuple(size):
            image = image.resize(tuple(size), Image.BILINEAR)
        return np.asarray(image, dtype=np.uint8)

    # ---- input (CSS pixels) -----------------------------------------------------------------------------
    def click(self, x: float, y: float, clicks: int = 1) -> None:
        self._mouse("mouseMoved", x, y)
        for count in range(1, clicks + 1):
            self._mouse("mousePressed", x, y, button="left", clickCount=count)
            self._mouse("mouseReleased", x, y, button="left", clickCount=count)

    def _mouse(self, kind: str, x: float, y: float, **extra) -> None:
        self._cdp("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})

    def type_text(self, text: str) -> None:
        """Insert text at the focused element; "\\n" presses Enter."""
        for i, chunk in enumerate(text.split("\n")):
            if i:
                self.press_keys(("Enter",))
            if chunk:
                self._cdp("Input.insertText", {"text": chunk})

    def press_keys(self, keys: Sequence[str]) -> None:
        """Press keys together, e.g. ("ctrl", "a") or ("Enter",). ValueError names an unknown key."""
        for event in key_events(keys):
            self._cdp("Input.dispatchKeyEvent", event)

    def scroll(self, x: float, y: float, dx: float, dy: float) -> None:
        self._mouse("mouseWheel", x, y, deltaX=dx, deltaY=dy)


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
    return str(text).strip().splitlines()[0][:300] if str(text).strip() else type(exc).__name__
