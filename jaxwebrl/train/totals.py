"""A run's running totals across a resume (metrics.jsonl's rollout/*, buffer/* and trainer/* counts): a checkpoint
stores them, the resumed trainer goes on from them instead of from 0.

The resumed trainer reads the buffer again from the checkpoint's cursor, so it meets, and counts again, the episodes
read but not yet trained or dropped then and the losses that the reads from that cursor on counted
(`ReadLedger.resume_point`): the stored totals leave those out. The judge's counts go on too (judge/verdicts,
judge/failures/<cause>); its latencies restart (train/judge_metrics.py).

    meta["running_totals"] = at_resume_point(trainer, point["losses_read_again"], pending_episodes)
    go_on_from(trainer, start.totals)
"""

from __future__ import annotations

from jaxwebrl.train.gatherer import TOTALS
from jaxwebrl.train.judge_metrics import JudgeTally

TRAINER_COUNTERS = ("dropped_invalid_episodes", "skipped_batches", "skipped_updates")   # metrics trainer/<name>


def at_resume_point(trainer, losses_read_again: dict[str, int], pending: list) -> dict[str, int]:
    """The totals a resume from this point goes on from ({metric name: count}): `trainer`'s, less the `pending`
    episodes (read, not yet trained or dropped) and the `losses_read_again` that the resume meets again."""
    counts = trainer.gatherer.counts
    totals = {metric: int(getattr(counts, field)) for field, metric in TOTALS.items()}
    totals["rollout/episodes_seen"] -= len(pending)
    read_again = JudgeTally()
    for episode in pending:
        read_again.note(episode)
    again = read_again.counts()
    totals.update({k: n - again.get(k, 0) for k, n in counts.judge.counts().items()})
    totals.update({f"buffer/{k}": int(n) - int(losses_read_again.get(k, 0)) for k, n in trainer.reads.losses.items()})
    totals.update({f"trainer/{name}": int(getattr(trainer, name)) for name in TRAINER_COUNTERS})
    return totals


def go_on_from(trainer, totals: dict[str, int]) -> None:
    """Set `trainer`'s running totals to `totals` (a checkpoint's `at_resume_point`; {}: all 0)."""
    for field, metric in TOTALS.items():
        setattr(trainer.gatherer.counts, field, int(totals.get(metric, 0)))
    for kind in trainer.reads.losses:
        trainer.reads.losses[kind] = int(totals.get(f"buffer/{kind}", 0))
    for name in TRAINER_COUNTERS:
        setattr(trainer, name, int(totals.get(f"trainer/{name}", 0)))
    trainer.gatherer.counts.judge.go_on_from(totals)
