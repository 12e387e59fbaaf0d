"""Groups are completed, env-failed and stale episodes excluded and counted, uniform groups dropped, batches whole."""

import numpy as np

from jaxwebrl.train.dynamic_sampling import BatchGatherer, oldest_version


def episode(episode_id, group_id, reward, *, version=1, env_failed=False, steps=2):
    return {
        "episode_id": episode_id, "group_id": np.int64(group_id), "reward": np.float32(reward),
        "env_failed": np.full(steps, env_failed),
        "loss_mask": [np.array([0, 0, 1, 1], np.int8)] * steps,
        "versions": [np.array([-1, -1, version, version + 1], np.int32)] + [np.array([-1, -1, version + 1, version + 1], np.int32)] * (steps - 1),
    }


def test_oldest_version_ignores_prompt_tokens():
    assert oldest_version(episode(0, 0, 1.0, version=3)) == 3 and oldest_version(episode(0, 0, 1.0)) == 1


def test_groups_filtered_and_batched_whole():
    g = BatchGatherer(group_size=4, consumer_batch_size=6, max_head_offpolicyness=1)
    g.add([episode(0, 10, 1), episode(1, 10, 0), episode(2, 11, 1), episode(3, 10, 0)])
    assert g.pop_batch(current_version=0) is None  # group 10 still open (3 of 4)
    g.add([episode(4, 10, 1, env_failed=True)])    # group 10 complete; its failed episode is excluded
    for i, r in enumerate([1, 1, 1]):
        g.add([episode(5 + i, 11, r)])              # group 11 all successes: uniform, dropped
    for i, r in enumerate([0, 1, 0, 1]):
        g.add([episode(8 + i, 12, r, version=0)])
    for i, r in enumerate([0, 1, 0, 1]):
        g.add([episode(12 + i, 13, r, version=5)])
    assert g.pending_episode_ids() == list(range(16))
    batch = g.pop_batch(current_version=2)          # group 12 (oldest version 0 < 2 - 1) is stale: dropped
    assert sorted(e["episode_id"] for e in batch) == [0, 1, 3, 12, 13, 14, 15]
    c = g.counts
    assert (c.env_failed, c.dropped_uniform_groups, c.dropped_stale, c.groups_accepted) == (1, 1, 4, 2)
    assert g.pending_episode_ids() == [] and g.pop_batch(current_version=2) is None


def test_too_few_keeps_groups_for_next_time():
    g = BatchGatherer(group_size=2, consumer_batch_size=4, max_head_offpolicyness=2, dynamic_sampling=False)
    g.add([episode(0, 1, 1), episode(1, 1, 1)])
    assert g.pop_batch(0) is None and g.ready_trajectories() == 2
    g.add([episode(2, 2, 0), episode(3, 2, 0)])
    assert [e["episode_id"] for e in g.pop_batch(0)] == [0, 1, 2, 3]
