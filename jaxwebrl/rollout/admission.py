"""Admission control: how many groups of episodes may be in flight, so rollout never runs further ahead of the trainer
than the staleness bound lets it use (AReaL's rollout capacity, `(η + version + 1) · B − (accepted + running)`).

    gate = Admission(group_size=G)
    gate.set_limit(capacity=(η + 1) * B, backlog=ready)   # the trainer, on every poll and after every step
                                                          # (at least one group a worker: train/trainer.py)
    gate.enter(worker_id, group_id)                       # the policy server, on a group's first generate request

A group is admitted while `backlog + G · running < capacity`: `backlog` is the trajectories the trainer has read
but not yet trained or dropped, `running` the groups admitted to other workers and still being played. A worker
asking for a new group has finished (or abandoned) its previous one, so that one stops counting as running; a
worker that went silent for `ttl_s` no longer counts either. Nothing leaks when a worker dies mid-group: its
replacement has the same id. Without a `set_limit` call nothing is gated.

A worker asks for one thing at a time, so its newer request supersedes one of its own still waiting: that one raises
`Superseded` at once (its client timed out and asked again; it would have held a handler thread and been decoded
for nobody).

What it buys: in asynchronous mode the workers stop producing episodes the trainer would only drop as stale (on a
few shared cores that CPU goes to the trainer); in synchronous mode (η = 0) one round is played per policy
version, stragglers included, as in a classic synchronous system.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class Superseded(RuntimeError):
    """A waiting request gave way to a newer request of the same worker (its client had given up on it)."""


class Admission:
    """Gate for new groups (see the module docstring). Thread-safe; `enter` blocks."""

    def __init__(self, group_size: int, *, ttl_s: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.group_size = int(group_size)
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._cond = threading.Condition()
        self._capacity: int | None = None
        self._backlog = 0
        self._groups: dict[int, tuple[int, float]] = {}   # worker id -> (group id being played, last request)
        self._requests: dict[int, int] = {}                 # worker id -> its requests so far (the newest's number)
        self._closed = False
        self.waited_s = 0.0                                 # total time requests waited for admission

    def set_limit(self, capacity: int, backlog: int) -> None:
        """Trajectories allowed in flight or waiting (`capacity`), and those the trainer holds unconsumed."""
        with self._cond:
            self._capacity, self._backlog = int(capacity), int(backlog)
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiting request: nothing is gated any more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def running(self, now: float | None = None, *, besides: int | None = None) -> int:
        """Groups being played by workers other than `besides`, heard from within ttl_s."""
        now = self._clock() if now is None else now
        with self._cond:
            return sum(1 for worker, (_, seen) in self._groups.items()
                       if worker != besides and now - seen <= self.ttl_s)

    def enter(self, worker_id: int, group_id: int, stop: Callable[[], bool] = lambda: False) -> None:
        """Record a request of `worker_id` for `group_id`; when that group is new, wait until it is admitted.
        Raises Superseded when a newer request of the same worker comes while this one waits."""
        worker_id, group_id = int(worker_id), int(group_id)
        with self._cond:
            ticket = self._requests[worker_id] = self._requests.get(worker_id, 0) + 1
            self._cond.notify_all()               # an older request of this worker still waiting gives way
            current = self._groups.get(worker_id)
            if current is not None and current[0] == group_id:
                self._groups[worker_id] = (group_id, self._clock())
                return
            self._groups.pop(worker_id, None)     # its previous group is over: it no longer counts as running
            start = self._clock()
            while not (self._closed or stop() or self._admits(worker_id)):
                self._cond.wait(timeout=0.5)
                if self._requests[worker_id] != ticket:
                    raise Superseded(f"worker {worker_id}'s request for group {group_id} was superseded by its newer "
                                     f"request while it waited for admission (its client gave up on it): dropped")
            self._groups[worker_id] = (group_id, self._clock())
            self.waited_s += self._clock() - start
            self._cond.notify_all()

    def _admits(self, worker_id: int) -> bool:
        if self._capacity is None:
            return True
        return self._backlog + self.group_size * self.running(besides=worker_id) < self._capacity
