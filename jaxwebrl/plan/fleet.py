"""The discrete-event model of the live loop: W browsers playing groups, the policy server batching their
generate requests, the admission gate, the trainer's consumption rule and weight publishing.

    params = FleetParams(workers=16, mode="async", ...)      # calibration.py builds them from measured JSON
    result = simulate(params, seed=0)                        # deterministic for a seed
    result["trajectories_per_hour"], result["trainer_idle_fraction"], result["staleness"]

What each part does, as the real loop does it (docs/live_loop.md):
- a worker plays its G episodes one after the other; its group's first generate request asks the gate
  (rules.admits, against the backlog the trainer last published; blocked workers retry whenever the gate's state
  changes), as the policy server does; an episode is a reset, then per step a generate request, the browser's own
  work (CPU on its pool, the rest a pure delay) and the page delay of the latency regime (env/latency.py's
  lognormal, the same function); an episode's min_version is the version of its first reply;
- the policy server takes the first queued request and whatever else is queued (up to max_batch, no deadline),
  runs the batch for `server_s0 + server_s1 · b` seconds of work on its pool, replies with its version; it starts
  no batch while paused (synchronous mode pauses it for the whole update);
- the trainer holds a rules.Gatherer: a group reaches it when its G-th episode is appended; when idle it pops a
  batch for its version, works `update_fixed_s + update_s_per_row · rows` on its pool, publishes v + 1 after
  `publish_s`, and sets the gate's limit (backlog = trajectories read but not consumed).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from jaxwebrl.env.latency import LatencyConfig, page_delays
from jaxwebrl.plan import rules
from jaxwebrl.plan.engine import Clock

MODES = ("async", "sync")


@dataclasses.dataclass(frozen=True)
class EpisodeMix:
    """Episode lengths and rewards: a horizon H drawn uniformly from `horizons`; success with probability
    `success_p`; the steps are 1 + Binomial(H − 1, q), q set so their mean is `success_steps` (successes) or
    `failure_fraction` · H (failures), capped at H by construction."""

    horizons: tuple[int, ...] = (5,)
    success_p: float = 0.1
    success_steps: float = 3.0
    failure_fraction: float = 1.0

    def __post_init__(self):
        if not 0 <= self.success_p <= 1 or not 0 < self.failure_fraction <= 1:
            raise ValueError(f"success_p={self.success_p!r}, failure_fraction={self.failure_fraction!r}: "
                             f"both must be fractions (failure_fraction > 0)")

    @staticmethod
    def _q(horizon: int, mean: float) -> float:
        """The binomial's q for steps of `mean` within [1, horizon] (0 for a horizon of 1)."""
        return min(max((mean - 1) / (horizon - 1), 0.0), 1.0) if horizon > 1 else 0.0

    def _steps(self, rng: np.random.Generator, horizon: int, mean: float) -> int:
        return 1 + int(rng.binomial(horizon - 1, self._q(horizon, mean)))

    def draw(self, rng: np.random.Generator) -> tuple[int, float]:
        """(steps, reward) of one episode."""
        horizon = int(self.horizons[int(rng.integers(len(self.horizons)))])
        if rng.random() < self.success_p:
            return self._steps(rng, horizon, self.success_steps), 1.0
        return self._steps(rng, horizon, self.failure_fraction * horizon), 0.0

    def mean_steps(self) -> float:
        """Expected steps an episode over the mix."""
        def mean(h: int, m: float) -> float:
            return 1 + (h - 1) * self._q(h, m)

        return float(np.mean([self.success_p * mean(h, self.success_steps)
                              + (1 - self.success_p) * mean(h, self.failure_fraction * h) for h in self.horizons]))


@dataclasses.dataclass(frozen=True)
class FleetParams:
    """Everything the model needs, in seconds of work as it runs alone (see the module docstring).

    pools: cores of each pool (None: unlimited, every job at full speed: browsers on hosts of their own, a
    trainer on accelerators of its own); the *_pool fields place browsers, server and trainer."""

    workers: int
    group_size: int
    batch: int
    eta: int
    mode: str = "async"
    dynamic_sampling: bool = True
    max_batch: int = 8
    episodes: EpisodeMix = EpisodeMix()
    latency: LatencyConfig = LatencyConfig()
    browser_step_s: float = 0.1            # the browser's and worker's own time a step (and a reset)
    browser_step_sigma: float = 0.0        # lognormal spread of it
    browser_cpu_fraction: float = 1.0      # of browser_step_s that is CPU work (the rest waits)
    restart_s: float = 0.0                 # a fresh browser session before each group (sync_rebuilt)
    server_s0: float = 0.02
    server_s1: float = 0.0
    server_cores: float = 1.0
    update_fixed_s: float = 0.0
    update_s_per_row: float = 0.05
    trainer_cores: float = 2.0
    publish_s: float = 0.0
    pools: tuple[tuple[str, float | None], ...] = (("host", 2.0),)
    browser_pool: str = "host"
    server_pool: str = "host"
    trainer_pool: str = "host"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: use one of {MODES}")
        for name in ("workers", "group_size", "batch", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")

    @property
    def effective_eta(self) -> int:
        """η the gatherer and the gate use: 0 in synchronous mode (train/rl_config.py max_offpolicyness)."""
        return 0 if self.mode == "sync" else int(self.eta)


class _Loop:
    """One run of the model; `simulate` drives it."""

    def __init__(self, p: FleetParams, seed: int):
        self.p = p
        self.clock = Clock(dict(p.pools))
        self.rng = np.random.default_rng([seed, 0])
        self.delay_rng = np.random.default_rng([seed, 1])
        self.eta = p.effective_eta
        self.capacity = rules.admission_capacity(eta=self.eta, batch=p.batch, workers=p.workers,
                                                 group_size=p.group_size)
        self.gatherer = rules.Gatherer(batch=p.batch, eta=self.eta, dynamic_sampling=p.dynamic_sampling)
        self.version = 0
        self.running: set[int] = set()        # workers playing an admitted group
        self.gate_backlog = 0                 # the backlog the trainer last published to the gate
        self.blocked: collections.deque = collections.deque()   # (worker, continuation, since) at the gate
        self.queue: collections.deque = collections.deque()     # the server's queued reply callbacks
        self.server_busy = False
        self.paused = False
        self.training = False
        self.server_busy_s = 0.0
        self.batches = self.requests = 0
        self.group_seq = 0
        self.updates: list[dict] = []         # per update: start, end, trajectories, staleness list
        self.admission_wait_s = 0.0

    # ---------------------------------------------------------------- workers
    def browser_time(self, then) -> None:
        """The browser's own time for one step or reset: CPU work on its pool, then the waiting part."""
        p = self.p
        seconds = p.browser_step_s * (float(self.rng.lognormal(0.0, p.browser_step_sigma))
                                      if p.browser_step_sigma else 1.0)
        cpu = seconds * p.browser_cpu_fraction
        self.clock.work(p.browser_pool, cpu, 1.0, lambda: self.clock.after(seconds - cpu, then))

    def page_delay(self, then) -> None:
        delay = page_delays(self.delay_rng, self.p.latency) if self.p.latency.enabled else 0.0
        self.clock.after(delay, then)

    def start_group(self, worker: int) -> None:
        """A new group: (a fresh browser,) then its first episode's reset; its first generate asks the gate."""
        group = {"id": self.group_seq, "episodes": []}
        self.group_seq += 1
        if self.p.restart_s:
            self.clock.after(self.p.restart_s, lambda: self.play_episode(worker, group))
        else:
            self.play_episode(worker, group)

    def admit(self, worker: int, then, since: float | None = None) -> None:
        """The gate (rules.admits, against the backlog the trainer last published): `then` once admitted. A worker
        asking stops counting its previous group as running (Admission.enter)."""
        self.running.discard(worker)
        since = self.clock.now if since is None else since
        if not rules.admits(backlog=self.gate_backlog, running_others=len(self.running),
                            group_size=self.p.group_size, capacity=self.capacity):
            self.blocked.append((worker, then, since))
            return
        self.admission_wait_s += self.clock.now - since
        self.running.add(worker)
        then()

    def wake_blocked(self) -> None:
        """The gate's state changed: blocked workers ask again, in the order they blocked."""
        waiting, self.blocked = self.blocked, collections.deque()
        for worker, then, since in waiting:
            self.admit(worker, then, since)

    def play_episode(self, worker: int, group: dict) -> None:
        steps, reward = self.p.episodes.draw(self.rng)
        episode = {"steps": steps, "reward": reward, "min_version": None}
        first_of_group = not group["episodes"]

        def step(k: int) -> None:
            if k == steps:
                return self.episode_done(worker, group, episode)

            def replied(version: int) -> None:
                if episode["min_version"] is None:   # versions only grow: the first reply's is the oldest
                    episode["min_version"] = version
                self.browser_time(lambda: self.page_delay(lambda: step(k + 1)))

            if k == 0 and first_of_group:
                self.admit(worker, lambda: self.generate(replied))
            else:
                self.generate(replied)

        self.browser_time(lambda: self.page_delay(lambda: step(0)))   # the reset

    def episode_done(self, worker: int, group: dict, episode: dict) -> None:
        group["episodes"].append(rules.Episode(group["id"], episode["min_version"], episode["reward"],
                                               episode["steps"]))
        if len(group["episodes"]) < self.p.group_size:
            return self.play_episode(worker, group)
        self.gatherer.add_group(group["episodes"])
        self.trainer_poll()
        self.start_group(worker)

    # ---------------------------------------------------------------- policy server
    def generate(self, reply) -> None:
        self.queue.append(reply)
        self.serve()

    def serve(self) -> None:
        if self.server_busy or self.paused or not self.queue:
            return
        batch = [self.queue.popleft() for _ in range(min(self.p.max_batch, len(self.queue)))]
        self.server_busy, start, version = True, self.clock.now, self.version

        def done() -> None:
            self.server_busy = False
            self.server_busy_s += self.clock.now - start
            self.batches += 1
            self.requests += len(batch)
            for reply in batch:
                reply(version)
            self.serve()

        self.clock.work(self.p.server_pool, self.p.server_s0 + self.p.server_s1 * len(batch), self.p.server_cores,
                        done)

    # ---------------------------------------------------------------- trainer
    def trainer_poll(self) -> None:
        """The idle trainer's poll: publish the backlog to the gate, then try a batch (train/trainer.py: the limit
        is set on every poll, every idle_sleep_s, and after every step, so during an update the gate keeps the
        pre-batch backlog, and while idle it sees what the failed pop left: dropped groups are gone)."""
        if self.training:
            return
        self.gate_backlog = self.gatherer.ready_trajectories()
        episodes = self.gatherer.pop_batch(self.version)
        if episodes is None:
            self.gate_backlog = self.gatherer.ready_trajectories()   # the next poll, idle_sleep_s later
            return self.wake_blocked()
        self.training, start = True, self.clock.now
        if self.p.mode == "sync":
            self.paused = True
        rows = sum(e.steps for e in episodes)
        lags = [self.version - e.min_version for e in episodes]

        def published() -> None:
            self.version += 1
            self.training = False
            self.updates.append({"start": start, "end": self.clock.now, "trajectories": len(episodes),
                                 "rows": rows, "staleness": lags})
            if self.p.mode == "sync":
                self.paused = False
                self.serve()
            self.trainer_poll()

        self.clock.work(self.p.trainer_pool, self.p.update_fixed_s + self.p.update_s_per_row * rows,
                        self.p.trainer_cores, lambda: self.clock.after(self.p.publish_s, published))


def simulate(params: FleetParams, seed: int = 0, *, updates: int = 40, warmup: int = 1,
             counted_at: int | None = None) -> dict:
    """Run the model until `updates` train steps; steady-state figures exclude the first `warmup` (as
    bench/async_vs_sync.py excludes the compiling first step). `trainer_idle_fraction_as_counted` is the idle
    share from the start to the end of update `counted_at` (the trainer's own metric at that step; default: the
    last). Deterministic for a seed."""
    loop = _Loop(params, seed)
    for worker in range(params.workers):
        loop.start_group(worker)
    loop.clock.run(until=lambda: len(loop.updates) >= updates, max_time=1e7)
    if len(loop.updates) <= warmup:
        raise RuntimeError(f"the fleet model made {len(loop.updates)} updates (asked {updates}): nothing reaches "
                           f"the trainer; check batch={params.batch} against workers x group_size")
    return _summary(loop, warmup, min(counted_at or updates, len(loop.updates)))


def _summary(loop: _Loop, warmup: int, counted_at: int) -> dict:
    updates, p = loop.updates, loop.p
    first, last = updates[warmup - 1]["end"], updates[-1]["end"]
    steady = updates[warmup:]
    span = last - first
    trained = sum(u["trajectories"] for u in steady)
    busy = sum(u["end"] - u["start"] for u in steady)
    lags = [lag for u in steady for lag in u["staleness"]]
    histogram = collections.Counter(lags)
    end = loop.clock.now
    at = updates[counted_at - 1]["end"]
    counted = 1.0 - sum(u["end"] - u["start"] for u in updates[:counted_at]) / at
    return {
        "mode": p.mode,
        "workers": p.workers,
        "updates": len(updates),
        "steady_state_updates": len(steady),
        "seconds_per_step": span / len(steady),
        "trajectories_per_hour": trained / span * 3600.0,
        "trainer_idle_fraction": 1.0 - busy / span,
        "trainer_idle_fraction_as_counted": counted,
        "update_s_mean": busy / len(steady),
        "rows_per_update_mean": float(np.mean([u["rows"] for u in steady])),
        "staleness": {"mean": float(np.mean(lags)), "max": int(max(lags)),
                      "distribution": {str(k): histogram[k] / len(lags) for k in sorted(histogram)}},
        "dropped_stale": loop.gatherer.counts.dropped_stale,
        "dropped_uniform_groups": loop.gatherer.counts.dropped_uniform_groups,
        "groups_played": loop.group_seq,
        "server_busy_fraction": loop.server_busy_s / end if end else None,
        "server_mean_batch": loop.requests / loop.batches if loop.batches else None,
        "admission_wait_fraction": loop.admission_wait_s / (end * p.workers) if end else None,
    }
