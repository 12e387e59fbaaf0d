"""Finished episodes waiting in a rollout worker for their judge's verdict, appended by a lander thread as verdicts
come, so neither the browser nor a worker blocked on the policy server (a group held back by admission control)
ever waits on a judge.

    awaiting = AwaitingEpisodes(append, who="worker 3", warn=RateLimitedLog(log))
    awaiting.add(result.pending_reward, parts)     # the episode's last StepResult handed its verdict off
    counts = awaiting.take_counts()                # what landed since the last call: verdicts, episodes, ... (below)
    left = awaiting.land(timeout_s=None)           # wait until every episode has landed (evaluation)
    dropped = awaiting.close(timeout_s=10.0)       # shutdown: what comes in 10 s lands, the rest is dropped

`append(parts, reward, judge, failure)` assembles and appends one episode (on the lander thread: it must only write
the buffer, which takes writes from several threads). A verdict is a Future of (reward, info)
(`jaxwebrl.env.base.StepResult.pending_reward`); landed, an episode gets `reward` and `judge`: the info without
`success`/`evaluated`, plus `judged_refs`, the buffer refs of the screenshots of the steps the judge looked at
(`judged_steps`). A Future that raised (a JudgeFailure: timeout, HTTP error, malformed verdict, blocked page) lands
as `failure`, "Type: message", and `judge` {"judge_failure": that}: an env-failed episode, one rate-limited line.

Counts (WorkerStats fields, folded in by the worker's thread): verdicts, judge_failures, env_failures, successes,
episodes, buffer_s, and for an append the buffer refused (EpisodeError, BufferWriteError: its group stays short)
buffer_failures and dropped_episodes; `max_buffer_failures` of those in a row make `land` raise `BufferUnusable`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Callable

from jaxwebrl.buffer.episode import EpisodeError
from jaxwebrl.buffer.schema import BufferWriteError

log = logging.getLogger(__name__)

MAX_AWAITING = 64   # episodes waiting for a verdict before handing off one more waits for a landing


class BufferUnusable(RuntimeError):
    """Episode after episode was refused by the buffer or could not be written (disk full): the worker stops."""


@dataclasses.dataclass(frozen=True)
class AwaitingVerdict:
    """One finished episode: its `verdict` Future and `parts` (the worker's assembly arguments, `steps` among them:
    each with the `ref` of the screenshot it was played from)."""

    verdict: concurrent.futures.Future
    parts: dict


class AwaitingEpisodes:
    """Episodes waiting for their verdicts; one lander thread (started on the first `add`) appends each as it comes."""

    def __init__(self, append: Callable[[dict, float, dict, str | None], None], *, who: str, warn,
                 limit: int = MAX_AWAITING, max_buffer_failures: int = 5):
        self._append, self._who, self._warn = append, who, warn
        self._limit, self._max_buffer_failures = int(limit), int(max_buffer_failures)
        self._cond = threading.Condition()
        self._waiting: list[AwaitingVerdict] = []
        self._counts: collections.Counter = collections.Counter()
        self._failures_in_a_row = 0
        self._error: BaseException | None = None
        self._closing = False
        self._landing: AwaitingVerdict | None = None   # the episode the lander is appending now
        self._lander: threading.Thread | None = None

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)

    def add(self, verdict: concurrent.futures.Future, parts: dict) -> None:
        """Keep an episode until its verdict comes; with `limit` waiting, wait for one to land first."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._waiting) < self._limit or self._error is not None)
            self._waiting.append(AwaitingVerdict(verdict, parts))
            if self._lander is None:
                self._lander = threading.Thread(target=self._land_as_they_come, name=f"{self._who} lander",
                                                daemon=True)
                self._lander.start()
        verdict.add_done_callback(self._wake)

    def take_counts(self) -> collections.Counter:
        """The counts (module docstring) since the last call."""
        with self._cond:
            counts, self._counts = self._counts, collections.Counter()
        return counts

    def land(self, timeout_s: float | None = 0.0) -> int:
        """Wait up to `timeout_s` (None: no limit) until every episode has landed; returns how many still wait.
        Raises BufferUnusable when the buffer refused too many in a row."""
        with self._cond:
            if timeout_s != 0.0:
                self._cond.wait_for(lambda: not self._waiting or self._error is not None, timeout=timeout_s)
            if self._error is not None:
                raise self._error
            return len(self._waiting)

    def close(self, timeout_s: float) -> int:
        """Land what comes within `timeout_s`, stop the lander, drop the episodes still waiting (one log line);
        returns how many were dropped (not the one the lander is appending: it lands). Never raises."""
        with self._cond:
            self._cond.wait_for(lambda: not self._waiting or self._error is not None, timeout=timeout_s)
            self._closing = True
            dropped = sum(a is not self._landing for a in self._waiting)
            self._waiting = [a for a in self._waiting if a is self._landing]
            self._cond.notify_all()
        if self._lander is not None:
            self._lander.join(timeout=timeout_s)
        if dropped:
            log.warning("%s: %d episodes dropped at close: their verdicts did not come within %g s", self._who,
                        dropped, timeout_s)
        return dropped

    def _wake(self, _future) -> None:
        with self._cond:
            self._cond.notify_all()

    def _land_as_they_come(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or any(a.verdict.done() for a in self._waiting))
                if self._closing:
                    return
                ready = [a for a in self._waiting if a.verdict.done()]
            for awaiting in ready:
                with self._cond:
                    if self._closing:   # close dropped the rest: none of them lands after it
                        return
                    self._landing = awaiting
                try:
                    counts = self._land(awaiting)
                except BaseException as exc:  # noqa: BLE001 - a bug in the append: the worker raises it at `land`
                    with self._cond:
                        self._error, self._landing = exc, None
                        self._cond.notify_all()
                    return
                with self._cond:
                    self._landing = None
                    self._waiting.remove(awaiting)
                    self._counts.update(counts)
                    self._cond.notify_all()

    def _land(self, awaiting: AwaitingVerdict) -> collections.Counter:
        reward, judge, failure = settled(awaiting)
        counts = collections.Counter()
        if failure is None:
            counts.update(verdicts=1, successes=int(reward > 0))
        else:
            counts.update(judge_failures=1, env_failures=1)
            self._warn.warning("judge", "%s: judge failed on %s (%s); episode env-failed", self._who,
                               awaiting.parts["task_id"], failure)
        start = time.perf_counter()
        try:
            self._append(awaiting.parts, reward, judge, failure)
            counts.update(episodes=1)
            self._failures_in_a_row = 0
        except (EpisodeError, BufferWriteError) as exc:   # its slot cannot be replayed: its group stays short
            counts.update(buffer_failures=1, dropped_episodes=1)
            self._failures_in_a_row += 1
            log.warning("%s: a judged episode could not be appended (%d in a row): %s", self._who,
                        self._failures_in_a_row, exc)
            if self._failures_in_a_row >= self._max_buffer_failures:
                with self._cond:
                    self._error = BufferUnusable(f"{self._who}: {self._failures_in_a_row} judged episodes in a row "
                                                 f"could not be appended; last: {exc}")
        counts["buffer_s"] += time.perf_counter() - start
        return counts


def settled(awaiting: AwaitingVerdict) -> tuple[float, dict, str | None]:
    """(reward, judge record, None) of a verdict that came; (0.0, {"judge_failure": failure}, failure) of a judge
    that raised, failure = "Type: message"."""
    try:
        reward, info = awaiting.verdict.result()
    except Exception as exc:  # noqa: BLE001 - a JudgeFailure (an EnvFailure) or a judge's bug: the episode failed
        failure = f"{type(exc).__name__}: {exc}"
        return 0.0, {"judge_failure": failure}, failure
    judge = {k: v for k, v in info.items() if k not in ("success", "evaluated")}
    refs = [step.ref for step in awaiting.parts["steps"]]
    judge["judged_refs"] = [refs[i] for i in info.get("judged_steps", ())]
    return float(reward), judge, None
