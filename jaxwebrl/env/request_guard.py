"""Network-level allowlist: every request of the page (navigation or subresource, http(s) or file://) is paused
by CDP `Fetch` and continued only when the allowlist allows it; the rest fail with BlockedByClient before
anything leaves the browser.

Selenium's `execute_cdp_cmd` cannot receive CDP events, so the guard opens its own DevTools websocket to the
page target (Chrome accepts several clients per target) and answers `Fetch.requestPaused` on a daemon thread.
If the guard's thread dies, paused requests stall and the browser's page-load timeout turns that into an
EnvTimeout: a broken guard can block too much, never too little.
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


class RequestGuard:
    """Answers every paused request of one page target with continue (allowed) or fail (blocked).

    allows: callable url -> bool, read on every request (so the browser can swap allowlists per task).
    blocked: the most recent refused URLs (newest last), for tests and diagnostics.
    """

    def __init__(self, debugger_address: str, allows: Callable[[str], bool], *, connect_timeout_s: float = 10.0):
        import websocket  # websocket-client, a selenium dependency

        self._allows = allows
        self.blocked: collections.deque[str] = collections.deque(maxlen=100)
        self.allowed_count = 0
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        with urllib.request.urlopen(f"http://{debugger_address}/json/list", timeout=connect_timeout_s) as resp:
            targets = json.load(resp)
        pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
        if not pages:
            raise RuntimeError(f"no page target at {debugger_address} to guard: {targets}")
        self._ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=connect_timeout_s,
                                               suppress_origin=True)
        self._send("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]})
        reply = self._receive_reply()
        if "error" in reply:
            self._ws.close()
            raise RuntimeError(f"Fetch.enable failed: {reply['error']}")
        self._ws.settimeout(None)
        self._thread = threading.Thread(target=self._serve, name="request-guard", daemon=True)
        self._thread.start()

    def _send(self, method: str, params: dict) -> int:
        message_id = next(self._ids)
        with self._send_lock:
            self._ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
        return message_id

    def _receive_reply(self) -> dict:
        while True:  # events may arrive before the reply to Fetch.enable
            message = json.loads(self._ws.recv())
            if "id" in message:
                return message
            self._handle(message)

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
        if message.get("method") != "Fetch.requestPaused":
            return
        params = message["params"]
        url = params["request"]["url"]
        if self._allows(url):
            self.allowed_count += 1
            self._send("Fetch.continueRequest", {"requestId": params["requestId"]})
        else:
            self.blocked.append(url)
            log.info("blocked request to %s (outside the task allowlist)", url)
            self._send("Fetch.failRequest", {"requestId": params["requestId"], "errorReason": "BlockedByClient"})

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing a dead socket
            pass
