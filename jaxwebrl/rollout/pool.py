"""A supervised pool of rollout worker processes (spawn context, JSON configuration, no orphans).

    spec = {"worker": WorkerConfig fields, "buffer": {"path": DIR},
            "policy": {"kind": "remote", "address": "tcp://127.0.0.1:5555", "token": TOKEN}
                   or {"kind": "scripted", "responder": "toy_oracle", ...}   # test / diagnostic backend
            "stats_dir": DIR (optional: each worker writes worker_<id>.json after every group),
            "extensions": [module names] (optional: imported by every worker first),
            "placement": {"nice": int, "cpus": [int] | None} (optional: CPU placement of workers and browsers)}
    (`jaxwebrl.rollout.spec.worker_spec(config, ...)` makes one from a run config.)
    with WorkerPool(spec, num_workers=4) as pool:
        ...                                   # workers play and append episodes to the ring buffer

Supervision: a monitor thread restarts a worker that dies (immediately after a long life, with a growing pause
when it keeps dying young); a worker that exits with EXIT_FATAL (wrong token, bad configuration) is not
restarted, and neither is one that failed ``max_same_failures`` times in a row with the same error (a worker
writes its error as one line to a private report file before it exits; lines that differ only in their numbers,
such as a port or a pid, are the same error); ``raise_if_failed`` reports why, in
one line, so the run stops instead of restarting it forever. Every env spec of ``spec["worker"]["tasks"]`` is
validated in the parent first (`jaxwebrl.env.registry.check_env_spec`). What runs inside a worker process is
`worker_process.py`.

No orphans: each worker leads its own process group and asks the kernel for SIGTERM when the pool's thread
that started it dies (PR_SET_PDEATHSIG), so a crashed parent takes its workers along; a worker closes its
browsers on SIGTERM. The monitor also records every descendant of every worker (chromedriver, Chromium) and
kills those left behind by a worker that died or did not stop within the grace period, then deletes the
browser profile directories of that worker (and, at start, those of any dead owner).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Any

import psutil

from jaxwebrl.env.browser.chromium import PROFILE_DIR_PREFIX
from jaxwebrl.env.registry import check_env_spec
from jaxwebrl.extensions import import_extensions
from jaxwebrl.rollout.worker import WorkerConfig
from jaxwebrl.rollout.worker_process import EXIT_FATAL, worker_process_main

log = logging.getLogger(__name__)

LEFTOVER_EXIT_S = 10.0   # how long close() waits for SIGKILLed browser processes to exit
# How often a live worker's descendants are recorded: each record walks every process of the machine (psutil reads
# /proc/*/stat), and at every poll (0.2 s) for two workers that was ~4% of a core for the whole run; browsers live
# for many polls, and a worker that dies is recorded once more before its leftovers are killed.
DESCENDANTS_EVERY_S = 1.0
REPORTS_DIR_PREFIX = "jaxwebrl-pool-"  # + owner pid + "-" + random


class WorkerPool:
    """N supervised worker processes (see module docstring).

    spec: JSON-able dict (checked by a JSON round trip). grace_s: time a worker gets to stop after SIGTERM.
    poll_s: supervision period. min_uptime_s / max_backoff_s: crash-loop pause policy. max_same_failures: a worker
    that fails this many times in a row with the same error stops for good. first_worker_id: worker ids
    (episode info, seeds, stats files) are first_worker_id + 0..N-1, so pools on several nodes stay distinct.
    """

    def __init__(self, spec: dict[str, Any], num_workers: int, *, grace_s: float = 10.0, poll_s: float = 0.2,
                 min_uptime_s: float = 10.0, max_backoff_s: float = 30.0, max_same_failures: int = 3,
                 first_worker_id: int = 0):
        self._spec_json = checked_spec_json(spec, num_workers)
        self.first_worker_id = int(first_worker_id)  # ids first..first+N-1: distinct across hand-started nodes
        self.num_workers = int(num_workers)
        self.grace_s, self.poll_s = float(grace_s), float(poll_s)
        self.min_uptime_s, self.max_backoff_s = float(min_uptime_s), float(max_backoff_s)
        self.max_same_failures = max(1, int(max_same_failures))
        self._streaks: list[tuple[str | None, int]] = [(None, 0)] * self.num_workers   # (last failure, in a row)
        self._reports_dir: str | None = None
        self._context = multiprocessing.get_context("spawn")
        self._procs: list[Any] = [None] * self.num_workers
        self._started_at = [0.0] * self.num_workers
        self._incarnation = [0] * self.num_workers
        self._backoff = [0.0] * self.num_workers
        self._next_start = [0.0] * self.num_workers
        self._descendants: dict[int, dict[int, float]] = {}  # worker pid -> {descendant pid: create_time}
        self._recorded_at: dict[int, float] = {}              # worker pid -> when its descendants were recorded
        self.restarts = 0
        self.fatal: dict[int, str] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._monitor: threading.Thread | None = None
        self._monitor_error: str | None = None   # why the supervisor thread died (raise_if_failed says it)

    # ------------------------------------------------------------------ public
    def start(self) -> "WorkerPool":
        if self._monitor is not None:
            raise RuntimeError("WorkerPool already started")
        self._reports_dir = tempfile.mkdtemp(prefix=f"{REPORTS_DIR_PREFIX}{os.getpid()}-")  # 0700: workers' failures
        for prefix in (REPORTS_DIR_PREFIX, PROFILE_DIR_PREFIX):  # left by runs that were killed outright
            remove_dead_owner_dirs(prefix)
        started = threading.Event()
        self._monitor = threading.Thread(target=self._supervise, args=(started,), name="worker-pool", daemon=True)
        self._monitor.start()
        started.wait()
        return self

    @property
    def pids(self) -> list[int | None]:
        with self._lock:
            return [p.pid if p is not None and p.is_alive() else None for p in self._procs]

    def alive(self) -> int:
        return sum(pid is not None for pid in self.pids)

    def raise_if_failed(self) -> None:
        """RuntimeError naming the workers that exited with a fatal error (they are not restarted), or why the
        supervisor thread died."""
        if self._monitor_error is not None:
            raise RuntimeError(f"the worker pool's supervisor thread died ({self._monitor_error}); its rollout "
                               "workers were stopped")
        if self._monitor is not None and not self._monitor.is_alive() and not self._closing.is_set():
            raise RuntimeError("the worker pool's supervisor thread died; rollout workers are not supervised")
        if self.fatal:
            details = "; ".join(f"worker {w}: {why}" for w, why in sorted(self.fatal.items()))
            raise RuntimeError(f"rollout workers stopped for good: {details}")

    def close(self) -> None:
        """SIGTERM every worker, SIGKILL what is left after ``grace_s``, kill leftover browsers. Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join()
        if self._reports_dir is not None:
            shutil.rmtree(self._reports_dir, ignore_errors=True)

    def __enter__(self) -> "WorkerPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ supervision (monitor thread)
    def _supervise(self, started: threading.Event) -> None:
        # Workers are started from this thread so their PR_SET_PDEATHSIG follows its life: it ends in close().
        try:
            for worker_id in range(self.num_workers):
                try:
                    self._start_worker(worker_id)
                except Exception:  # e.g. out of processes: the loop below retries
                    log.exception("worker pool: starting worker %d failed", worker_id)
        finally:
            started.set()
        try:
            while not self._closing.wait(self.poll_s):
                for worker_id in range(self.num_workers):
                    try:
                        self._check_worker(worker_id)
                    except Exception:  # supervision must go on (a failed fork is retried after the backoff)
                        log.exception("worker pool: supervising worker %d failed", worker_id)
                        self._next_start[worker_id] = time.monotonic() + self.max_backoff_s
        except BaseException as exc:  # noqa: BLE001 - recorded before the workers are stopped (SIGTERM)
            self._monitor_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            log.exception("worker pool supervisor died: %s; stopping the workers", self._monitor_error)
        finally:
            self._stop_all()

    def _report_path(self, worker_id: int) -> str:
        return os.path.join(self._reports_dir, f"worker_{worker_id}.txt")

    def _start_worker(self, worker_id: int) -> None:
        _take_report(self._report_path(worker_id))  # a stale report must not be read as this life's
        proc = self._context.Process(
            target=worker_process_main,
            args=(self._spec_json, self.first_worker_id + worker_id, self._incarnation[worker_id], os.getpid(),
                  self._report_path(worker_id)),
            name=f"rollout-worker-{self.first_worker_id + worker_id}", daemon=False)
        proc.start()
        with self._lock:
            self._procs[worker_id] = proc
        self._started_at[worker_id] = time.monotonic()
        self._descendants[proc.pid] = {}

    def _check_worker(self, worker_id: int) -> None:
        proc = self._procs[worker_id]
        if proc is None:
            if worker_id not in self.fatal and time.monotonic() >= self._next_start[worker_id]:
                self._incarnation[worker_id] += 1
                self.restarts += 1
                self._start_worker(worker_id)
            return
        if proc.is_alive():
            if time.monotonic() - self._recorded_at.get(proc.pid, -math.inf) >= DESCENDANTS_EVERY_S:
                self._record_descendants(proc.pid)
            return
        code = proc.exitcode
        self._kill_leftovers(proc.pid)
        with self._lock:
            self._procs[worker_id] = None
        failure = _take_report(self._report_path(worker_id))
        if code == EXIT_FATAL:
            self.fatal[worker_id] = f"exited with a fatal error (code {code}): {failure or 'see its log above'}"
            log.error("worker %d exited with a fatal error; not restarting it", worker_id)
            return
        self._streaks[worker_id] = failure_streak(self._streaks[worker_id], failure)
        if self._streaks[worker_id][1] >= self.max_same_failures:
            self.fatal[worker_id] = f"failed {self._streaks[worker_id][1]} times in a row with: {failure}"
            log.error("worker %d failed %d times in a row with the same error; not restarting it: %s", worker_id,
                      self._streaks[worker_id][1], failure)
            return
        lived = time.monotonic() - self._started_at[worker_id]
        self._backoff[worker_id] = next_backoff(self._backoff[worker_id], lived, self.min_uptime_s, self.max_backoff_s)
        self._next_start[worker_id] = time.monotonic() + self._backoff[worker_id]
        log.warning("worker %d (pid %d) died with exit code %s after %.1f s; restarting in %.1f s",
                    worker_id, proc.pid, code, lived, self._backoff[worker_id])

    def _record_descendants(self, pid: int) -> None:
        self._recorded_at[pid] = time.monotonic()
        known = self._descendants.setdefault(pid, {})
        try:
            for child in psutil.Process(pid).children(recursive=True):
                known.setdefault(child.pid, child.create_time())
        except psutil.Error:
            pass

    def _kill_leftovers(self, pid: int) -> None:
        """Kill the worker's process group and every recorded descendant that is still the same process, and wait
        until they are gone (a SIGKILLed process lives on until the kernel schedules its exit: on a loaded machine
        a browser was still alive when close() returned, and its profile was deleted under it)."""
        self._record_descendants(pid)
        killed = []
        self._recorded_at.pop(pid, None)
        for target, created in self._descendants.pop(pid, {}).items():
            try:
                process = psutil.Process(target)
                if abs(process.create_time() - created) < 1e-3:
                    process.kill()
                    killed.append(process)
            except psutil.Error:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + LEFTOVER_EXIT_S
        while (survivors := [p for p in killed if _runs(p.pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)   # (a zombie counts as gone: its parent, or init, reaps it)
        if survivors:
            log.warning("worker pid %d: %d of its browser processes (pids %s) still run %.0f s after SIGKILL",
                        pid, len(survivors), [p.pid for p in survivors], LEFTOVER_EXIT_S)
        remove_dead_owner_dirs(PROFILE_DIR_PREFIX, pid)  # the browsers are dead now: their profiles go too

    def _stop_all(self) -> None:
        procs = [p for p in self._procs if p is not None]
        for proc in procs:
            if proc.is_alive():
                self._record_descendants(proc.pid)
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + self.grace_s
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                log.warning("worker pid %d did not stop within %.1f s; killing it", proc.pid, self.grace_s)
                proc.kill()
                proc.join(timeout=5)
            self._kill_leftovers(proc.pid)
        with self._lock:
            self._procs = [None] * self.num_workers


def checked_spec_json(spec: dict[str, Any], num_workers: int) -> str:
    """The pool spec as JSON (what crosses into worker processes or Ray actors), checked as `_check_spec` does."""
    if int(num_workers) < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    try:
        spec_json = json.dumps(spec)
    except TypeError as exc:
        raise TypeError(f"worker pool spec must be JSON-able (no objects, it crosses processes): {exc}") from None
    _check_spec(json.loads(spec_json))
    return spec_json


def next_backoff(previous_s: float, lived_s: float, min_uptime_s: float, max_backoff_s: float) -> float:
    """Pause before restarting a worker that lived `lived_s`: none after a long life, doubling while it dies young."""
    if lived_s < min_uptime_s:
        return min(max_backoff_s, max(0.5, 2 * previous_s))
    return 0.0


def failure_streak(streak: tuple[str | None, int], failure: str | None) -> tuple[str | None, int]:
    """(failure, how many lives in a row failed like it) after a worker life that ended with the one-line `failure`
    (None: it left none), given the previous life's `streak`. Lines that differ only in their numbers are the same
    failure (a port, a pid, a token count or an address differs from life to life: chromedriver's port is picked
    per start)."""
    def kind(line):
        return None if line is None else re.sub(r"0x[0-9a-fA-F]+|\d+", "#", line)

    same = failure is not None and kind(failure) == kind(streak[0])
    return failure, streak[1] + 1 if same else int(failure is not None)


def _check_spec(spec: dict) -> None:
    """Fail in the parent, with a clear message, on what would make every worker die at start."""
    for key in ("worker", "policy", "buffer"):
        if key not in spec:
            raise ValueError(f"worker pool spec lacks {key!r}: give 'worker' (WorkerConfig fields), "
                             "'policy' ({'kind': 'remote'|'scripted', ...}) and 'buffer' ({'path': DIR})")
    unknown = set(spec) - {"worker", "policy", "buffer", "stats_dir", "extensions", "placement"}
    if unknown:
        raise ValueError(f"unknown worker pool spec key(s) {sorted(unknown)}")
    import_extensions(spec.get("extensions"))   # the envs they register must be known here, as in every worker
    config = WorkerConfig.from_dict(spec["worker"])
    for index, task in enumerate(config.tasks):  # before any worker (or browser) starts
        try:
            check_env_spec(task)
        except (ValueError, TypeError) as err:
            raise ValueError(f"worker.tasks[{index}]: {' '.join(str(err).split())}") from None
    kind = spec["policy"].get("kind")
    if kind == "remote":
        missing = {"address", "token"} - set(spec["policy"])
        if missing:
            raise ValueError(f"remote policy spec lacks {sorted(missing)}")
    elif kind != "scripted":
        raise ValueError(f"policy kind must be 'remote' or 'scripted', got {kind!r}")
    if "path" not in spec["buffer"]:
        raise ValueError("buffer spec lacks 'path' (the ring buffer made by RingBuffer.create)")


def _take_report(path: str) -> str | None:
    """The one-line failure a worker left at `path` (deleted), or None."""
    try:
        with open(path) as f:
            line = f.read().strip()
        os.remove(path)
        return line or None
    except OSError:
        return None


def remove_dead_owner_dirs(prefix: str, owner_pid: int | None = None) -> list[str]:
    """Delete temp dirs named `prefix` + owner pid + "-..." whose owner process is gone: those of `owner_pid` (a
    worker just reaped), or with None those of every owner that no longer runs. A dir whose owner runs is never
    touched. Returns the removed paths (browser profiles: PROFILE_DIR_PREFIX; a pool's reports: REPORTS_DIR_PREFIX)."""
    root = tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError as exc:
        log.warning("worker pool: cannot list %s to remove dead workers' directories: %s", root, exc)
        return removed
    for name in names:
        match = re.fullmatch(re.escape(prefix) + r"(\d+)-\w+", name)
        if not match or (owner_pid is not None and int(match.group(1)) != owner_pid) or _runs(int(match.group(1))):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(os.path.join(root, name))
    if removed:
        log.info("worker pool: removed %d director%s of dead owners (%s*)", len(removed),
                 "y" if len(removed) == 1 else "ies", prefix)
    return removed


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def read_stats(stats_dir: str) -> list[dict]:
    """The latest stats JSON of every worker that wrote one (see the ``stats_dir`` spec key)."""
    if not os.path.isdir(stats_dir):
        return []
    out = []
    for name in sorted(os.listdir(stats_dir)):
        if name.startswith("worker_") and name.endswith(".json"):
            with open(os.path.join(stats_dir, name)) as f:
                out.append(json.load(f))
    return out
