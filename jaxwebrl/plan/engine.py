"""The fleet model's clock: timers, and CPU pools shared by processor sharing.

    clock = Clock({"host": 2.0})                 # a pool of 2 cores; None: every job runs at full speed
    clock.after(0.8, on_page_loaded)             # a pure delay (a page loading, a network hop)
    clock.work("host", 0.05, 1.0, on_done)       # 0.05 s of work as it runs alone, using up to 1 core
    clock.run(until=lambda: done)                # events in time order; ties in the order they were made

A pool runs every job it holds at one common speed, min(1, cores / demand), where demand is the sum of its jobs'
cores: a job of `seconds` (its time alone) finishes once the pool's virtual clock (the integral of that speed)
has advanced by `seconds` since it started. Deterministic: no randomness here, ties break by creation order.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable


class Pool:
    """Jobs sharing `cores` (None: unlimited) by processor sharing."""

    def __init__(self, cores: float | None):
        self.cores = cores
        self.virtual = 0.0
        self.demand = 0.0
        self._jobs: list[tuple[float, int, float, Callable[[], None]]] = []   # (virtual end, seq, demand, done)

    @property
    def speed(self) -> float:
        if self.cores is None or self.demand <= self.cores:
            return 1.0
        return self.cores / self.demand

    def add(self, seconds: float, demand: float, done: Callable[[], None], seq: int) -> None:
        heapq.heappush(self._jobs, (self.virtual + max(float(seconds), 0.0), seq, float(demand), done))
        self.demand += float(demand)

    def next_end(self, now: float) -> tuple[float, int]:
        """(real time, seq) of the next job to finish at the current speed, or (inf, -1)."""
        if not self._jobs:
            return float("inf"), -1
        end, seq, _, _ = self._jobs[0]
        return now + (end - self.virtual) / self.speed, seq

    def advance(self, dt: float) -> None:
        self.virtual += dt * self.speed

    def pop(self) -> Callable[[], None]:
        _, _, demand, done = heapq.heappop(self._jobs)
        self.demand = max(self.demand - demand, 0.0) if self._jobs else 0.0
        return done


class Clock:
    """Event loop over timers and pools (see the module docstring)."""

    def __init__(self, pools: dict[str, float | None]):
        self.now = 0.0
        self.pools = {name: Pool(cores) for name, cores in pools.items()}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (self.now + max(float(seconds), 0.0), next(self._seq), fn))

    def work(self, pool: str, seconds: float, demand: float, fn: Callable[[], None]) -> None:
        if self.pools[pool].cores is None:   # nothing to share: the job is a plain delay
            return self.after(seconds, fn)
        self.pools[pool].add(seconds, demand, fn, next(self._seq))

    def run(self, until: Callable[[], bool], max_time: float = float("inf")) -> None:
        """Process events in order until `until()` holds, nothing is left, or the clock passes `max_time`."""
        while not until():
            when, seq, source = (self._timers[0][0], self._timers[0][1], None) if self._timers else (
                float("inf"), -1, None)
            for pool in self.pools.values():
                end, pseq = pool.next_end(self.now)
                if end < when or (end == when and pseq < seq):
                    when, seq, source = end, pseq, pool
            if when == float("inf") or when > max_time:
                return
            dt = when - self.now
            for pool in self.pools.values():
                pool.advance(dt)
            self.now = when
            fn = source.pop() if source is not None else heapq.heappop(self._timers)[2]
            fn()
