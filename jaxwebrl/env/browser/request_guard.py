"""Network-level allowlist: every request of every tab, popup, frame and worker (navigation or subresource,
http(s) or file://) is paused by CDP `Fetch` and continued only when the allowlist allows it; the rest fail
with BlockedByClient before anything leaves the browser.

Selenium's `execute_cdp_cmd` cannot receive CDP events, so the guard opens its own DevTools websocket to the
*browser* target (Chrome accepts several clients) and turns on auto-attach with `waitForDebuggerOnStart`:
each new target (a popup from a target=_blank link, a cross-site iframe, a worker) is paused until the guard
has enabled `Fetch` in it, so not even its first request escapes. A daemon thread answers
`Fetch.requestPaused`. If that thread dies, paused requests and new targets stall and the page-load timeout
turns that into an EnvTimeout: a broken guard blocks too much, never too little.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import threading
import urllib.request
from typing import Callable

log = logging.getLogger(__name__)

GUARDED_TARGET_TYPES = ("page", "iframe", "worker", "shared_worker", "service_worker")
_AUTO_ATTACH = {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}


class RequestGuard:
    """Answers every paused request in the browser with continue (allowed) or fail (blocked).

    allows: callable url -> bool, read on every request (so the browser can swap allowlists per task).
    blocked: the most recent refused URLs (newest last), for tests and diagnostics.
    """

    def __init__(self, debugger_address: str, allows: Callable[[str], bool], *, connect_timeout_s: float = 10.0):
        import websocket  # websocket-client, a selenium dependency

        self._allows = allows
        self.blocked: collections.deque[str] = collections.deque(maxlen=100)
        self.allowed_count = 0
        self.guarded_targets = 0
        self.popups_opened = 0  # new tabs/windows opened after start-up (the browser closes them: single tab)
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._fetch_enable_ids: set[int] = set()
        self._first_page_guarded = threading.Event()
        with urllib.request.urlopen(f"http://{debugger_address}/json/version", timeout=connect_timeout_s) as resp:
            browser_ws = json.load(resp)["webSocketDebuggerUrl"]
        self._ws = websocket.create_connection(browser_ws, timeout=connect_timeout_s, suppress_origin=True)
        self._ws.settimeout(None)
        self._thread = threading.Thread(target=self._serve, name="request-guard", daemon=True)
        self._thread.start()
        self._send("Target.setAutoAttach", _AUTO_ATTACH)  # also attaches the targets that already exist
        if not self._first_page_guarded.wait(connect_timeout_s):
            self.close()
            raise RuntimeError(f"request guard could not enable Fetch in a page within {connect_timeout_s} s")

    def _send(self, method: str, params: dict, session_id: str | None = None) -> int:
        message_id = next(self._ids)
        message = {"id": message_id, "method": method, "params": params}
        if session_id:
            message["sessionId"] = session_id
        with self._send_lock:
            self._ws.send(json.dumps(message))
        return message_id

    def _serve(self) -> None:
        try:
            while True:
                raw = self._ws.recv()
                if not raw:
                    return
                self._handle(json.loads(raw))
        except Exception as exc:  # noqa: BLE001 - the socket closes when the browser goes away
            log.debug("request guard stopped: %s", exc)

    def _handle(self, message: dict) -> None:
        method, session = message.get("method"), message.get("sessionId")
        if method == "Fetch.requestPaused":
            params = message["params"]
            url = params["request"]["url"]
            if self._allows(url):
                self.allowed_count += 1
                self._send("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
            else:
                self.blocked.append(url)
                log.info("blocked request to %s (outside the task allowlist)", url)
                self._send("Fetch.failRequest", {"requestId": params["requestId"], "errorReason": "BlockedByClient"},
                           session)
        elif method == "Target.attachedToTarget":
            params = message["params"]
            child, kind = params["sessionId"], params["targetInfo"]["type"]
            if kind == "page" and session is None and self._first_page_guarded.is_set():
                self.popups_opened += 1
            if kind in GUARDED_TARGET_TYPES:
                enable_id = self._send("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]},
                                       child)
                if kind == "page":
                    self._fetch_enable_ids.add(enable_id)
                self._send("Target.setAutoAttach", _AUTO_ATTACH, child)  # its iframes and workers
                self.guarded_targets += 1
            self._send("Runtime.runIfWaitingForDebugger", {}, child)  # Fetch is on: let the target start
        elif message.get("id") in self._fetch_enable_ids:
            if "error" in message:
                log.warning("request guard: Fetch.enable failed in a page: %s", message["error"])
            else:
                self._first_page_guarded.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing a dead socket
            pass
