"""The checkpointed resume point re-reads exactly the episodes not yet consumed, on a real ring buffer."""

import numpy as np

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig
from jaxwebrl.train.gatherer import BatchGatherer
from jaxwebrl.train.ledger import ReadLedger


def ids(episodes):
    return [e.episode_id for e in episodes]


def test_resume_point_skips_consumed_and_rereads_pending(tmp_path):
    buf = RingBuffer.create(str(tmp_path / "buf"), capacity_steps=256, max_seq_len=1024, screenshot_shape=(64, 64, 3),
                            max_images_per_step=1)
    backend = ScriptedBackend(toy_oracle_responder(0.5), fetch_image=buf.screenshots.get, seed=1)
    worker = RolloutWorker(WorkerConfig(tasks=("toy",), group_size=2, prompt={"window": 0}, max_new_tokens=32),
                           InProcessClient(backend), buf)
    worker.run(max_groups=3)

    ledger = ReadLedger(None)
    gatherer = BatchGatherer(consumer_batch_size=2, max_head_offpolicyness=5, dynamic_sampling=False)
    before = ledger.cursor
    first = buf.read(before, group_size=2, max_episodes=4)               # groups 1 and 2
    gatherer.add_groups(ledger.record(before, first.cursor, first.groups))
    trained = gatherer.pop_batch(0)                                       # group 1 consumed, group 2 pending
    assert len(trained) == 2
    worker.run(max_groups=1)
    before = ledger.cursor
    second = buf.read(before, group_size=2)                               # groups 3 and 4
    gatherer.add_groups(ledger.record(before, second.cursor, second.groups))
    trained += gatherer.pop_batch(0)                                      # group 2 consumed
    pending = {e.episode_id for e in gatherer.pending_episodes()}
    assert len(pending) == 4

    point = ledger.resume_point(pending)                                  # what a checkpoint stores now
    restarted = ReadLedger(point["cursor"], point["consumed"])
    again = buf.read(point["cursor"], group_size=2)
    fresh = [e for group in restarted.record(point["cursor"], None, again.groups) for e in group]
    assert sorted(ids(fresh)) == sorted(pending)
    assert not set(ids(fresh)) & set(ids(trained))
    assert np.all([e.steps[0].num_tokens > 0 for e in fresh])
