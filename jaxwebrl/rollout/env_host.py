"""The environments of one rollout worker, and the one thread that makes every call into them.

Why one thread: Selenium browsers are not thread-safe, and a browser dies with the *thread* that launched
it (chromedriver gets PR_SET_PDEATHSIG, which follows the launching thread). So envs are created, reset,
stepped and closed on a single long-lived thread; the worker waits at most ``timeout_s`` per call.

    host = EnvHost(factory, timeout_s=120, max_open_envs=4, share_browser=True)
    env = host.get("miniwob/click-test")           # created on the env thread, kept (least recently used
    obs = host.call(lambda: env.reset(seed), "reset")   #  envs beyond max_open_envs are closed)
    host.discard("miniwob/click-test")             # after an EnvFailure: close it, a fresh one next time
    host.close()

A call that outlives ``timeout_s`` raises EnvTimeout; the host then closes every env and the shared
browser (killing the processes frees the hung thread), abandons that thread and starts a new one.
With ``share_browser``, all envs of the worker whose task family shares a browser (MiniWoB++,
`registry.shares_browser`) use one Chromium (same viewport), so switching tasks loads a page instead of
starting a browser.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import queue
import threading
from typing import Any, Callable

from jaxwebrl.env.base import EnvTimeout
from jaxwebrl.env.registry import shares_browser

log = logging.getLogger(__name__)

EnvFactory = Callable[[Any, Any], Any]  # (spec, shared browser or None) -> Env


def task_name(task: Any) -> str:
    """A stable key for an env spec (str as is, a JSON task spec by its task_id)."""
    if isinstance(task, str):
        return task
    if isinstance(task, dict):
        return str(task.get("task_id") or json.dumps(task, sort_keys=True))
    return repr(task)


class _EnvThread:
    """A single daemon thread running submitted calls in order (a hung call never blocks interpreter exit,
    unlike ThreadPoolExecutor's threads, which are joined at exit)."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="env-thread", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        return future

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        self._queue.put(None)
        if wait:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered to the caller
                future.set_exception(exc)


class EnvHost:
    """See module docstring. ``factory(spec, browser)`` builds an env; browser is the shared Browser or None."""

    def __init__(self, factory: EnvFactory, *, timeout_s: float | None, max_open_envs: int = 4,
                 share_browser: bool = False):
        if max_open_envs < 1:
            raise ValueError(f"max_open_envs must be >= 1, got {max_open_envs}")
        self._factory = factory
        self.timeout_s = timeout_s
        self.max_open_envs = int(max_open_envs)
        self.share_browser = bool(share_browser)
        self._envs: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._browser = None
        self._executor = self._new_executor()

    @staticmethod
    def _new_executor() -> "_EnvThread":
        return _EnvThread()

    def call(self, fn: Callable[[], Any], what: str) -> Any:
        """``fn()`` on the env thread; EnvTimeout (and a full reset of the host) past ``timeout_s``."""
        future = self._executor.submit(fn)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            log.warning("%s did not return within %s s: closing every env and browser of this worker", what,
                        self.timeout_s)
            self._close_everything()
            raise EnvTimeout(f"{what} did not return within {self.timeout_s:g} s (hung browser or page)") from None

    def get(self, task: Any) -> Any:
        """The env for ``task`` (created on first use); the least recently used beyond max_open_envs is closed."""
        key = task_name(task)
        env = self._envs.pop(key, None)
        if env is None:
            while len(self._envs) >= self.max_open_envs:
                self._close_env(self._envs.popitem(last=False)[1])
            env = self.call(lambda: self._create(task), f"creating {key}")
        self._envs[key] = env  # most recently used last
        return env

    def _create(self, task: Any) -> Any:  # runs on the env thread
        browser = None
        if self.share_browser and isinstance(task, str) and shares_browser(task):
            if self._browser is None:
                # deferred (heavy): the browser imports Selenium; browser-free workers never load it
                from jaxwebrl.env.browser.browser import Browser
                from jaxwebrl.env.browser.chromium import BrowserConfig
                from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT

                self._browser = Browser(BrowserConfig(viewport=VIEWPORT))
            browser = self._browser
        return self._factory(task, browser)

    def discard(self, task: Any) -> None:
        """Close the env of ``task`` (after it failed); a shared browser restarts itself on the next reset."""
        env = self._envs.pop(task_name(task), None)
        if env is not None:
            self._close_env(env)

    def _close_env(self, env: Any, on_thread: bool = True) -> None:
        try:
            if on_thread:
                self._executor.submit(env.close).result(timeout=self.timeout_s)
            else:
                env.close()
        except Exception:  # closing must never stop the worker; the env is dropped either way
            log.exception("closing env %s failed", getattr(env, "task_id", env))

    def _close_everything(self) -> None:
        """Close envs and the shared browser from this thread (the env thread may be hung), new env thread."""
        envs, self._envs = list(self._envs.values()), collections.OrderedDict()
        browser, self._browser = self._browser, None
        for env in envs:
            self._close_env(env, on_thread=False)
        if browser is not None:
            browser.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = self._new_executor()

    def restart(self) -> None:
        """Close every env and the shared browser on the env thread; the next `get` starts them afresh (a pool
        rebuilt every round: `WorkerConfig.fresh_envs_per_group`)."""
        try:
            envs, self._envs = list(self._envs.values()), collections.OrderedDict()
            for env in envs:
                self._close_env(env)
            if self._browser is not None:
                browser, self._browser = self._browser, None
                self._executor.submit(browser.close).result(timeout=self.timeout_s)
        except Exception:  # a hung env thread: close from here, on a new thread
            log.exception("env thread did not close cleanly; closing from the worker thread")
            self._close_everything()

    def close(self) -> None:
        """Close every env and the shared browser on the env thread, then stop the thread."""
        self.restart()
        self._executor.shutdown(wait=False, cancel_futures=True)
