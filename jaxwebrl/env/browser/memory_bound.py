"""One memory bound on all the browsers of a rollout worker: a watchdog thread over their process trees.

    env = make_env(spec, browser_memory_mb=2048)   # registry.make_env: the env joins its process's bound
    bound_browser_memory(env, 2048)                # the same, for an env made another way
    PROCESS_BOUND.usage()                          # [(browser, bytes)] now

A worker is one process, so the bound is one per process (`PROCESS_BOUND`): every `INTERVAL_S` it sums the
resident anonymous memory (RSS less file-backed and shared pages: heaps, JS heaps, ArrayBuffers, what a page
allocates; the shared libraries each process maps would count ~4x) of chromedriver and every Chromium process of
every browser its envs use (the shared MiniWoB++ browser and those other envs own). Above the bound it kills the
largest browser's Chromium processes and marks it (`Browser.memory_breach`): the call in flight on that browser, or its
next one, raises a `PageFault` naming the bound and the fix (devtools.py), so the episode is env-failed (never
scored) and counted with the other page faults, and the env's next reset starts a fresh browser.

A watchdog, not a cgroup: it needs no delegation and no cgroup v2 memory controller (the machine this was built on
has memory only in cgroup v1), and it reads one /proc file a process. A page can overshoot the bound by what it
allocates in one interval; RLIMIT_DATA on each process (`BrowserConfig.memory_limit_mb`) stays the backstop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref

import psutil

INTERVAL_S = 0.5   # one sample: ~3 ms (listing the tree) + ~30 us a process
MB = 1 << 20


def anonymous_bytes(pids) -> int:
    """Resident anonymous memory of `pids` together (bytes); a process gone meanwhile counts 0."""
    total = 0
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_info()
        except psutil.Error:
            continue
        total += info.rss - info.shared
    return total


class BrowserMemoryBound:
    """The watchdog (see the module docstring). `limit_mb`: the bound (the last one `track` was given);
    `breaches`: browsers killed for it. The thread runs while an env it tracks is alive."""

    def __init__(self, interval_s: float = INTERVAL_S):
        self.interval_s = float(interval_s)
        self.limit_mb: int | None = None
        self.breaches = 0
        self._envs: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def track(self, env, limit_mb: int) -> None:
        """Count `env`'s browser (`env.browser`, looked up at every sample) under a bound of `limit_mb` MB."""
        with self._lock:
            self.limit_mb = int(limit_mb)
            self._envs.add(env)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="browser-memory", daemon=True)
                self._thread.start()

    def usage(self) -> list[tuple[object, int]]:
        """[(browser, resident anonymous bytes of its tree)] of every distinct live browser the envs use."""
        with self._lock:
            envs = list(self._envs)
        browsers = {id(b): b for b in (getattr(env, "browser", None) for env in envs) if b is not None}
        return [(b, anonymous_bytes(b.process_ids())) for b in browsers.values()]

    def check(self) -> str | None:
        """One sample; over the bound, kill and mark the largest browser and return the breach's message."""
        usage, limit = self.usage(), self.limit_mb
        total = sum(n for _, n in usage)
        if limit is None or total <= limit * MB:
            return None
        browser, own = max(usage, key=lambda item: item[1])
        message = (f"the worker's browsers held {total / MB:.0f} MB, over env.browser_memory_mb = {limit} MB; the "
                   f"largest ({own / MB:.0f} MB) was killed: a page that allocates without end is the task's fault, "
                   f"a sound task that needs more: raise env.browser_memory_mb (docs/env.md)")
        browser.memory_breach = message   # before the kill: the failing call must see it
        # Chromium only: chromedriver (first) then fails the call in flight at once with the browser's own error
        # (not connection retries), and Browser.close kills it.
        for pid in browser.process_ids()[1:]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.breaches += 1
        return message

    def _watch(self) -> None:
        while True:
            time.sleep(self.interval_s)
            with self._lock:
                if not self._envs:   # every tracked env is gone: stop (the next track starts a new thread)
                    self._thread = None
                    return
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a browser closed under the sample: the next sample sees it gone
                pass


PROCESS_BOUND = BrowserMemoryBound()


def bound_browser_memory(env, limit_mb: int) -> None:
    """Put `env`'s browser under this process's bound of `limit_mb` MB (an env without a browser: nothing)."""
    if hasattr(env, "browser"):
        PROCESS_BOUND.track(env, limit_mb)
