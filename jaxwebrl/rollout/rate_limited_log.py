"""Warnings that can come by the hundred (a refused peer, a cut episode, an env failure) at most once per period per
kind; the next one says how many were held back, so the log stays readable and the counts stay true.

    warn = RateLimitedLog(log, period_s=30.0)
    warn.warning("cut", "worker %d: step %d of %s ...", worker_id, step, task)
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """At most one warning per ``period_s`` per kind on ``logger``; the next one says how many were suppressed."""

    def __init__(self, logger: logging.Logger, period_s: float = 10.0):
        self.logger = logger
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, kind: str, message: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -1e9) < self.period_s:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {self.period_s:g} s)"
        self.logger.warning(message, *args)
