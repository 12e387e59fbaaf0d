"""The seconds a policy server was busy, readable at any moment (its `stats()["busy_s"]`).

Busy means at least one piece of work (a batch, an admission, a decode chunk, an engine request) was running;
overlapping work counts once, so busy seconds never outrun the wall clock. Work still running counts up to the
moment of the read: the difference of two reads is the busy time between them, never time from before the first
(a batch that began before a benchmark's window opened counts only its part inside the window).
"""

from __future__ import annotations

import contextlib
import threading
import time


class BusyClock:
    """Busy seconds over a server's life; `running()` around each piece of work, `seconds()` to read."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = 0          # pieces of work running now
        self._since = 0.0          # monotonic time the current busy stretch began (valid while _running > 0)
        self._total = 0.0          # seconds of the busy stretches that ended

    def start(self) -> None:
        with self._lock:
            if self._running == 0:
                self._since = time.monotonic()
            self._running += 1

    def stop(self) -> None:
        with self._lock:
            if self._running == 0:
                raise RuntimeError("BusyClock.stop() without a matching start()")
            self._running -= 1
            if self._running == 0:
                self._total += time.monotonic() - self._since

    @contextlib.contextmanager
    def running(self):
        self.start()
        try:
            yield
        finally:
            self.stop()

    def seconds(self) -> float:
        """Busy seconds so far, the running stretch up to now included."""
        with self._lock:
            return self._total + (time.monotonic() - self._since if self._running else 0.0)
