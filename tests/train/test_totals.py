"""A resumed run's running totals go on from its checkpoint's (`train/totals.py`), the judge's counts among them."""

import types

from jaxwebrl.train import totals
from jaxwebrl.train.gatherer import BatchGatherer


def _judged(episode_id: int, reward: float, judge: dict):
    return types.SimpleNamespace(episode_id=episode_id, reward=reward, info={"judge": judge}, task_id="t", cut=False,
                                 env_failed="judge_failure" in judge, num_steps=1, min_version=0)


def _group(first_id: int, cause: str) -> list:
    return [_judged(first_id, 1.0, {"judge_s": 0.5}), _judged(first_id + 1, 0.0, {"judge_s": 1.5}),
            _judged(first_id + 2, 0.0, {"judge_failure": f"judge x on t: {cause} after 1 attempt(s) at http://j"})]


def _trainer():
    gatherer = BatchGatherer(consumer_batch_size=2, max_head_offpolicyness=4)
    return types.SimpleNamespace(gatherer=gatherer, reads=types.SimpleNamespace(losses={"incomplete": 0}),
                                 **{name: 0 for name in totals.TRAINER_COUNTERS})


def _judge_counts(trainer) -> dict:
    metrics = trainer.gatherer.counts.as_metrics()
    return {k: v for k, v in metrics.items() if k.startswith("judge/") and "latency" not in k}


def test_the_judges_counts_go_on_from_the_checkpoint_less_the_episodes_read_again():
    straight, first, resumed = _trainer(), _trainer(), _trainer()
    straight.gatherer.add_groups([_group(0, "timed out"), _group(3, "HTTP 503")])
    first.gatherer.add_groups([_group(0, "timed out"), _group(3, "HTTP 503")])
    assert len(first.gatherer.pop_batch(current_version=0)) == 2     # the first group trained; the second pending
    pending = first.gatherer.pending_episodes()
    assert [e.episode_id for e in pending] == [3, 4, 5]
    saved = totals.at_resume_point(first, {}, pending)
    totals.go_on_from(resumed, saved)
    resumed.gatherer.add_groups([_group(3, "HTTP 503")])              # the resume reads the pending group again
    assert _judge_counts(resumed) == _judge_counts(straight) == {
        "judge/verdicts": 4, "judge/failures": 2, "judge/failures/http_503": 1, "judge/failures/timeout": 1}
