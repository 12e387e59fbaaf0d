"""Rollout workers as Ray actors (`config.rollout.launcher = "ray"`): same spec and surface as `WorkerPool`.

    pool = RayWorkerPool(spec, num_workers=48, address="ray://head:10001")   # or "auto", or None: local Ray
    with pool:                                     # start(): one actor per worker, placed by Ray on CPU nodes
        ...                                        # actors play and append episodes to the shared ring buffer
    pool.raise_if_failed()                         # wrong token / bad config: reported, never restarted

Each actor builds its worker from the JSON pool spec with `worker_process.build_worker` (the code path of local worker
processes and of launch/rollout.py), talks to the policy server over the pyzmq transport with the shared token
(`spec["policy"] = {"kind": "remote", "address": "tcp://HOST:PORT", "token": ...}`; the server must bind an
address the Ray nodes reach, `rollout.host`), and writes to the ring buffer at `spec["buffer"]["path"]`, a path
on a shared filesystem or a TensorStore kvstore URL (gs://...) every node can open. Only the JSON spec crosses
into Ray (as a string argument); episodes go through the buffer, never through Ray's object store.

Supervision mirrors `WorkerPool`: an actor whose process dies (node lost, OOM, crash) is replaced with the next
incarnation (a new seed), after a growing pause when it keeps dying young; an actor that stops on a fatal error
(refused token, bad configuration), or fails `max_same_failures` times in a row the same way, is not replaced and
`raise_if_failed` names the reason. `close` asks every
actor to stop (its browsers close), waits `grace_s`, then kills what is left.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
from typing import Any

from jaxwebrl.errors import one_line
from jaxwebrl.rollout.pool import WorkerPool, checked_spec_json, failure_streak, next_backoff
from jaxwebrl.rollout.worker import WorkerStats
from jaxwebrl.rollout.worker_process import build_worker, close_quietly, restart_cannot_help, write_stats

log = logging.getLogger(__name__)

RAY_HINT = 'the "ray" rollout launcher needs Ray: pip install "ray==2.60.0" (on the trainer and every rollout node)'


class FatalWorkerError(RuntimeError):
    """A worker cannot run with this spec (refused token, bad configuration): restarting would not help."""


def import_ray():
    """The `ray` module, or ImportError with the install hint."""
    try:
        import ray  # deferred: optional dependency (the ray extra), only for the ray launcher
    except ImportError as exc:
        raise ImportError(f"{RAY_HINT} ({exc})") from None
    return ray


class RolloutActor:
    """Body of one Ray actor: a rollout worker that plays groups until `stop` (threaded actor: run + stop)."""

    def __init__(self, spec_json: str, worker_id: int, incarnation: int):
        self.spec = json.loads(spec_json)
        self.worker_id, self.incarnation = int(worker_id), int(incarnation)
        self._stop = threading.Event()
        self._worker = None

    def run(self) -> dict:
        """Play until stopped; returns the worker's stats. Raises FatalWorkerError on a bad spec and on what
        `worker_process.restart_cannot_help` names (a refused token, ...)."""
        worker = client = None
        try:
            try:
                worker, client = build_worker(self.spec, self.worker_id, self.incarnation)
            except (ValueError, OSError) as exc:
                raise FatalWorkerError(f"worker {self.worker_id} cannot start: {exc}") from None
            self._worker = worker
            if self._stop.is_set():
                worker.stop()
            stats_dir = self.spec.get("stats_dir")
            while not self._stop.is_set():
                worker.run(max_groups=1)
                if stats_dir:
                    write_stats(stats_dir, self.worker_id, self.incarnation, worker.stats.to_dict())
            return worker.stats.to_dict()
        except Exception as exc:  # noqa: BLE001 - fatal where a worker process's exit would be
            if restart_cannot_help(exc):
                raise FatalWorkerError(f"worker {self.worker_id} stops for good: {one_line(exc, 1000)}") from None
            raise
        finally:
            close_quietly(worker, client)

    def stop(self) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.stop()

    def stats(self) -> dict:
        """The worker's counters (all zero while it is still being built)."""
        return (WorkerStats() if self._worker is None else self._worker.stats).to_dict()

    def node(self) -> str:
        return socket.gethostname()


class RayWorkerPool:
    """N supervised rollout workers as Ray actors (see the module docstring).

    address: Ray cluster address ("auto", "ray://head:10001", "head:6379") or None for a local Ray started
      here (`init_kwargs` go to `ray.init`, e.g. num_cpus); an already initialised Ray is used as it is.
    num_cpus_per_worker: CPUs Ray reserves per actor (a worker drives one headless Chromium).
    resources: custom Ray resources per actor, e.g. {"rollout": 1} to pin workers to rollout nodes.
    first_worker_id: worker ids are first_worker_id + 0..N-1 (as in `WorkerPool`).
    max_same_failures: an actor whose run failed this many times in a row the same way is not replaced (as there).
    """

    def __init__(self, spec: dict[str, Any], num_workers: int, *, address: str | None = None,
                 num_cpus_per_worker: float = 1.0, resources: dict[str, float] | None = None,
                 init_kwargs: dict[str, Any] | None = None, grace_s: float = 30.0, poll_s: float = 0.5,
                 min_uptime_s: float = 10.0, max_backoff_s: float = 30.0, max_same_failures: int = 3,
                 first_worker_id: int = 0):
        self._spec_json = checked_spec_json(spec, num_workers)
        self.num_workers = int(num_workers)
        self.first_worker_id = int(first_worker_id)
        self.address = address
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        self.resources = dict(resources or {})
        self.init_kwargs = dict(init_kwargs or {})
        self.grace_s, self.poll_s = float(grace_s), float(poll_s)
        self.min_uptime_s, self.max_backoff_s = float(min_uptime_s), float(max_backoff_s)
        self.max_same_failures = max(1, int(max_same_failures))
        self._streaks: list[tuple[str | None, int]] = [(None, 0)] * self.num_workers   # (last failure, in a row)
        self.restarts = 0
        self.fatal: dict[int, str] = {}
        self._ray = None
        self._owns_ray = False
        self._actor_class = None
        self._actors: list[Any] = [None] * self.num_workers
        self._runs: list[Any] = [None] * self.num_workers
        self._started_at = [0.0] * self.num_workers
        self._incarnation = [0] * self.num_workers
        self._backoff = [0.0] * self.num_workers
        self._next_start = [0.0] * self.num_workers
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._monitor: threading.Thread | None = None
        self._monitor_error: BaseException | None = None

    # ------------------------------------------------------------------ public
    def start(self) -> "RayWorkerPool":
        if self._monitor is not None:
            raise RuntimeError("RayWorkerPool already started")
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            _init_keeping_sigterm(ray, address=self.address, **self.init_kwargs)
            self._owns_ray = True
        options = {"num_cpus": self.num_cpus_per_worker, "max_concurrency": 4, "max_restarts": 0}
        if self.resources:
            options["resources"] = self.resources
        self._actor_class = ray.remote(**options)(RolloutActor)
        for worker_id in range(self.num_workers):
            self._start_actor(worker_id)
        self._monitor = threading.Thread(target=self._supervise, name="ray-worker-pool", daemon=True)
        self._monitor.start()
        return self

    def alive(self) -> int:
        with self._lock:
            return sum(run is not None for run in self._runs)

    def stats(self, timeout_s: float = 10.0) -> list[dict]:
        """Live stats of every running actor (worker_id, incarnation and the worker's counters)."""
        with self._lock:
            live = [(w, self._incarnation[w], a) for w, a in enumerate(self._actors) if a is not None]
        refs = [actor.stats.remote() for _, _, actor in live]
        out = []
        for (worker_id, incarnation, _), ref in zip(live, refs):
            try:
                out.append(dict(self._ray.get(ref, timeout=timeout_s), worker_id=worker_id, incarnation=incarnation))
            except Exception:  # an actor dying right now: the monitor replaces it
                continue
        return out

    def raise_if_failed(self) -> None:
        """RuntimeError naming the workers that stopped for good (or a dead supervisor)."""
        if self._monitor_error is not None:
            raise RuntimeError(f"the Ray worker pool's supervisor died: {self._monitor_error!r}")
        if self.fatal:
            details = "; ".join(f"worker {w}: {why}" for w, why in sorted(self.fatal.items()))
            raise RuntimeError(f"rollout workers stopped for good: {details}")

    def close(self) -> None:
        """Stop every actor (browsers close), kill those still running after `grace_s`; shut down a Ray this
        pool started. Idempotent."""
        if self._closing.is_set() or self._ray is None:
            return
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join()
        ray = self._ray
        with self._lock:
            live = [(a, r) for a, r in zip(self._actors, self._runs) if a is not None]
        for actor, _ in live:
            try:
                actor.stop.remote()
            except Exception:  # already dead
                pass
        runs = [r for _, r in live if r is not None]
        if runs:
            ray.wait(runs, num_returns=len(runs), timeout=self.grace_s)
        for actor, _ in live:
            ray.kill(actor, no_restart=True)
        with self._lock:
            self._actors = [None] * self.num_workers
            self._runs = [None] * self.num_workers
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> "RayWorkerPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ supervision
    def _start_actor(self, worker_id: int) -> None:
        actor = self._actor_class.options(name=None).remote(self._spec_json, self.first_worker_id + worker_id,
                                                              self._incarnation[worker_id])
        run = actor.run.remote()
        with self._lock:
            self._actors[worker_id], self._runs[worker_id] = actor, run
        self._started_at[worker_id] = time.monotonic()

    def _supervise(self) -> None:
        try:
            while not self._closing.is_set():
                with self._lock:
                    pending = {run: w for w, run in enumerate(self._runs) if run is not None}
                if pending:
                    done, _ = self._ray.wait(list(pending), num_returns=1, timeout=self.poll_s)
                    for run in done:
                        self._finished(pending[run], run)
                else:
                    self._closing.wait(self.poll_s)
                now = time.monotonic()
                for worker_id in range(self.num_workers):
                    if (self._runs[worker_id] is None and worker_id not in self.fatal and not self._closing.is_set()
                            and now >= self._next_start[worker_id]):
                        self._incarnation[worker_id] += 1
                        self.restarts += 1
                        self._start_actor(worker_id)
        except BaseException as exc:  # reported by raise_if_failed
            self._monitor_error = exc
            log.exception("Ray worker pool supervisor died")

    def _finished(self, worker_id: int, run) -> None:
        """An actor's run ended: stopped (fine), fatal (recorded), or died (replaced after a backoff). A fatal
        error is recorded before `alive()` drops, so a poller never sees the worker gone and the pool healthy."""
        ray = self._ray
        actor, reason, failure = self._actors[worker_id], None, None
        try:
            ray.get(run)
            reason = "returned without being stopped"
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, FatalWorkerError):
                self.fatal[worker_id] = str(cause.args[0] if cause.args else cause)
                log.error("rollout worker %d stopped for good: %s", worker_id, self.fatal[worker_id])
            else:
                reason, failure = f"failed: {cause!r}", one_line(getattr(exc, "cause", cause), 1000)
        except ray.exceptions.RayActorError as exc:
            reason = f"its actor died: {exc.__class__.__name__}"
        self._streaks[worker_id] = streak = failure_streak(self._streaks[worker_id], failure)
        if streak[1] >= self.max_same_failures and not self._closing.is_set():
            self.fatal[worker_id], reason = f"failed {streak[1]} times in a row with: {failure}", None
            log.error("rollout worker %d stopped for good: %s", worker_id, self.fatal[worker_id])
        with self._lock:
            self._actors[worker_id] = self._runs[worker_id] = None
        if actor is not None:
            ray.kill(actor, no_restart=True)
        if reason is None or self._closing.is_set():   # fatal, or stopping: not replaced
            return
        lived = time.monotonic() - self._started_at[worker_id]
        self._backoff[worker_id] = next_backoff(self._backoff[worker_id], lived, self.min_uptime_s, self.max_backoff_s)
        self._next_start[worker_id] = time.monotonic() + self._backoff[worker_id]
        log.warning("rollout worker %d %s after %.1f s; replacing it in %.1f s", worker_id, reason, lived,
                    self._backoff[worker_id])


def _init_keeping_sigterm(ray, **kwargs) -> None:
    """`ray.init`, keeping the caller's SIGTERM handler (ray.init replaces it; the trainer's must stop the run)."""
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if on_main_thread else None
    ray.init(**kwargs)
    if on_main_thread and previous is not None:
        signal.signal(signal.SIGTERM, previous)


def pool_for(config, spec: dict[str, Any]):
    """The worker pool `config.rollout.launcher` names, not yet started: "local" (`WorkerPool`, processes on
    this host) or "ray" (`RayWorkerPool`; `rollout.ray_address`, `rollout.ray_cpus_per_worker` and
    `rollout.ray_resources` (JSON) when the config has them)."""
    r = config.rollout
    launcher = r.launcher
    if launcher == "local":
        return WorkerPool(spec, r.num_workers)
    if launcher == "ray":
        resources = r.get("ray_resources", None)
        return RayWorkerPool(spec, r.num_workers, address=r.get("ray_address", None),
                             num_cpus_per_worker=float(r.get("ray_cpus_per_worker", 1.0) or 1.0),
                             resources=json.loads(resources) if isinstance(resources, str) else resources)
    raise ValueError(f"rollout.launcher={launcher!r}: use 'local' or 'ray'")
