"""The judge's metrics of a run, from the verdicts its episodes carry (`info["judge"]`, saved by the rollout worker):
the `judge/*` keys of metrics.jsonl, running totals over the episodes the trainer read.

    judge/verdicts                verdicts read
    judge/failures                judge failures read (their episodes env-failed, never scored)
    judge/failures/<cause>        of those, by cause (`webgym.verdicts.failure_cause`: timeout, http_503, ...)
    judge/latency_s/mean, /p95    seconds a verdict took, over the last LATENCY_WINDOW verdicts

A resumed run's counts go on from its checkpoint's (`counts` / `go_on_from`, kept with the other running totals:
train/totals.py); its latencies restart, since they describe the endpoint's recent answers (NaN until its first
verdict), not the run's history.

A run without judged episodes has none of these keys. Agreement needs a second judge: `python3 -m jaxwebrl.eval.judge`
re-judges a saved run.
"""

from __future__ import annotations

import collections

import numpy as np

from jaxwebrl.env.tasks.webgym.verdicts import failure_cause

LATENCY_WINDOW = 1024


class JudgeTally:
    """Running judge counts and recent latencies of the episodes `note`d (see the module docstring)."""

    def __init__(self):
        self.verdicts = 0
        self.failures: collections.Counter = collections.Counter()
        self._seconds: collections.deque = collections.deque(maxlen=LATENCY_WINDOW)

    def note(self, episode) -> None:
        judge = episode.info.get("judge")
        if judge is None:
            return
        if "judge_failure" in judge:
            self.failures[failure_cause(judge["judge_failure"])] += 1
        else:
            self.verdicts += 1
            self._seconds.append(float(judge["judge_s"]))

    def counts(self) -> dict[str, int]:
        """The running counts by metric name: judge/verdicts and judge/failures/<cause> (their sum is derived)."""
        return {"judge/verdicts": self.verdicts, **{f"judge/failures/{c}": n for c, n in self.failures.items()}}

    def go_on_from(self, counts: dict[str, int]) -> None:
        """Set the running counts to `counts` (as `counts` gives them; other keys are ignored)."""
        self.verdicts = int(counts.get("judge/verdicts", 0))
        causes = {k.removeprefix("judge/failures/"): int(n) for k, n in counts.items()
                  if k.startswith("judge/failures/")}
        self.failures = collections.Counter({cause: n for cause, n in causes.items() if n})

    def as_metrics(self) -> dict[str, float]:
        if not (self.verdicts or self.failures):
            return {}
        seconds = np.asarray(self._seconds, np.float64)
        return {"judge/verdicts": self.verdicts, "judge/failures": sum(self.failures.values()),
                **{f"judge/failures/{cause}": n for cause, n in sorted(self.failures.items())},
                "judge/latency_s/mean": float(seconds.mean()) if seconds.size else float("nan"),
                "judge/latency_s/p95": float(np.percentile(seconds, 95)) if seconds.size else float("nan")}
