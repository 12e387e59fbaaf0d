"""Finished episodes waiting in a rollout worker for their judge's verdict, so its browser plays on meanwhile.

    awaiting = AwaitingEpisodes(land)              # land(parts, reward, judge, failure): assemble and append one
    awaiting.add(result.pending_reward, parts)     # the episode's last StepResult handed its verdict off
    awaiting.land()                                # every episode whose verdict has come, now (never waits)
    awaiting.land(timeout_s=None)                  # ... after waiting for them all (evaluation)
    awaiting.close(timeout_s=10.0, who="worker 3")  # shutdown: what comes in 10 s lands, the rest is dropped

A verdict is a Future of (reward, info) (`jaxwebrl.env.base.StepResult.pending_reward`). Landed, an episode gets
`reward` and `judge`: the info without `success`/`evaluated`, plus `judged_refs`, the buffer refs of the screenshots
of the steps the judge looked at (`judged_steps`). A Future that raised (a JudgeFailure: timeout, HTTP error,
malformed verdict, blocked page) lands as `failure`, "Type: message", and `judge` {"judge_failure": that}: the
worker makes the episode env-failed.

Landing happens on the worker's own thread, at its next step (before the policy call) and after each episode, so the
buffer and the worker's counters have one writer. A verdict that comes while the worker waits on the policy server
(e.g. a new group held back by admission control) lands when that call returns.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Callable

log = logging.getLogger(__name__)

MAX_AWAITING = 64   # episodes waiting for a verdict before handing off one more waits for the oldest


@dataclasses.dataclass(frozen=True)
class AwaitingVerdict:
    """One finished episode: its `verdict` Future and `parts` (the worker's assembly arguments, `steps` among them:
    each with the `ref` of the screenshot it was played from)."""

    verdict: concurrent.futures.Future
    parts: dict


class AwaitingEpisodes:
    """Episodes waiting for their verdicts, landed through `land(parts, reward, judge, failure)` as they come."""

    def __init__(self, land: Callable[[dict, float, dict, str | None], None], limit: int = MAX_AWAITING):
        self._land, self._limit = land, int(limit)
        self._waiting: list[AwaitingVerdict] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, verdict: concurrent.futures.Future, parts: dict) -> None:
        """Keep an episode until its verdict comes (`land`); past `limit` waiting, wait for the oldest's first."""
        self._waiting.append(AwaitingVerdict(verdict, parts))
        if len(self._waiting) > self._limit:
            concurrent.futures.wait([self._waiting[0].verdict])

    def land(self, timeout_s: float | None = 0.0) -> int:
        """Land every episode whose verdict has come, after waiting up to `timeout_s` for them all (0: no wait;
        None: until all have come); returns how many still wait."""
        if self._waiting and timeout_s != 0.0:
            concurrent.futures.wait([a.verdict for a in self._waiting], timeout=timeout_s)
        for awaiting in list(self._waiting):
            if awaiting.verdict.done():
                self._waiting.remove(awaiting)   # first: a landing that raises never lands it twice
                self._land(awaiting.parts, *settled(awaiting))
        return len(self._waiting)

    def close(self, timeout_s: float, who: str) -> int:
        """Land what comes within `timeout_s`, then drop the episodes still waiting (one log line naming `who`);
        returns how many were dropped."""
        dropped = self.land(timeout_s)
        if dropped:
            log.warning("%s: %d episodes dropped at close: their verdicts did not come within %g s", who, dropped,
                        timeout_s)
        self._waiting = []
        return dropped


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
