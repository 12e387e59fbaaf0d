"""Whole groups filtered and batched: env-failed and stale episodes excluded and counted, uniform groups dropped."""

import numpy as np

from jaxwebrl.buffer.episode import Episode, Step
from jaxwebrl.train.gatherer import BatchGatherer, staleness


def episode(episode_id, group_id, reward, *, version=1, env_failed=False, steps=2, cut=False, info=None):
    """An Episode as `RingBuffer.read` returns it (episode_id set; `min_version`: its oldest policy-token version)."""
    step = Step(input_ids=np.arange(4), loss_mask=np.array([0, 0, 1, 1]),
                behave_logprobs=np.array([0, 0, -0.5, -0.5], np.float32),
                versions=np.array([-1, -1, version, version + 1]))
    return Episode(steps=(step,) * steps, task_id="toy", group_id=group_id, reward=reward, env_failed=env_failed,
                   cut=cut, info=info or {}, episode_id=episode_id)


def test_staleness_is_versions_behind_the_oldest_policy_token():
    assert staleness(episode(0, 0, 1.0, version=3), 5) == 2 and staleness(episode(0, 0, 1.0), 1) == 0


def test_groups_filtered_and_batched_whole():
    g = BatchGatherer(consumer_batch_size=6, max_head_offpolicyness=1)
    g.add_groups([[episode(0, 10, 1), episode(1, 10, 0), episode(3, 10, 0), episode(4, 10, 1, env_failed=True)]])
    g.add_groups([[episode(2, 11, 1), episode(5, 11, 1), episode(6, 11, 1), episode(7, 11, 1)]])   # uniform
    g.add_groups([[episode(8 + i, 12, r, version=0) for i, r in enumerate([0, 1, 0, 1])],          # stale at 2
                  [episode(12 + i, 13, r, version=5) for i, r in enumerate([0, 1, 0, 1])]])
    assert sorted(e.episode_id for e in g.pending_episodes()) == list(range(16)) and g.counts.episodes_seen == 16
    batch = g.pop_batch(current_version=2)          # group 12 (oldest version 0 < 2 - 1) is stale: dropped
    assert sorted(e.episode_id for e in batch) == [0, 1, 3, 12, 13, 14, 15]
    c = g.counts
    assert (c.env_failed, c.dropped_uniform_groups, c.dropped_stale, c.groups_accepted) == (1, 1, 4, 2)
    assert c.successes_seen == 1 + 4 + 2 + 2        # env-failed successes never count
    assert g.pending_episodes() == [] and g.pop_batch(current_version=2) is None


def test_an_episode_of_weights_a_crash_lost_is_dropped_as_stale_not_trained_as_fresh():
    """A resumed trainer (train/versions.py) numbers on past the versions its crash lost; an episode holding their
    tokens looks 1 version behind, yet its behaviour weights are gone: stale."""
    lost = lambda e: e.min_version <= 4 and e.max_version >= 3   # versions 3..4 lost
    g = BatchGatherer(consumer_batch_size=2, max_head_offpolicyness=4, lost_versions=lost)
    g.add_groups([[episode(0, 10, 1, version=4), episode(1, 10, 0, version=4)],
                  [episode(2, 11, 1, version=5), episode(3, 11, 0, version=5)]])
    assert [e.episode_id for e in g.pop_batch(current_version=6)] == [2, 3]
    assert g.counts.dropped_stale == 2


def test_too_few_keeps_groups_for_next_time():
    g = BatchGatherer(consumer_batch_size=4, max_head_offpolicyness=2, dynamic_sampling=False)
    g.add_groups([[episode(0, 1, 1), episode(1, 1, 1)]])
    assert g.pop_batch(0) is None and g.ready_trajectories() == 2
    g.add_groups([[episode(2, 2, 0), episode(3, 2, 0)]])
    assert [e.episode_id for e in g.pop_batch(0)] == [0, 1, 2, 3]


CUT = {"cut": {"step": 2, "tokens": 207, "max_seq_len": 190}}


def test_cut_episodes_are_excluded_and_counted_never_scored():
    g = BatchGatherer(consumer_batch_size=2, max_head_offpolicyness=1)
    g.add_groups([[episode(0, 1, 1), episode(1, 1, 0), episode(2, 1, 1, cut=True, steps=3, info=CUT)]])
    batch = g.pop_batch(current_version=1)
    assert [e.episode_id for e in batch] == [0, 1]
    assert (g.counts.cut_episodes, g.counts.cut_steps, g.counts.env_failed) == (1, 3, 0)
    assert g.counts.successes_seen == 1
    g.add_groups([[episode(3, 2, 0, cut=True, info=CUT), episode(4, 2, 1)]])   # the cut failure would have made a pair
    assert g.pop_batch(current_version=1) is None and g.counts.dropped_uniform_groups == 1


def test_a_run_whose_last_n_episodes_are_all_cut_or_all_env_failed_is_told_why():
    g = BatchGatherer(consumer_batch_size=2, max_head_offpolicyness=1)
    g.add_groups([[episode(i, 1, 0, cut=True, info=CUT) for i in range(3)]])
    assert g.unusable_run(4) == "" and g.unusable_run(0) == ""
    g.add_groups([[episode(3, 2, 0, cut=True, info=CUT)]])
    why = g.unusable_run(4)
    assert why.startswith("the last 4 episodes were all cut") and "207 tokens > buffer.max_seq_len=190" in why
    assert "--config.buffer.max_seq_len" in why and "train.stop_after_unusable_episodes=4" in why
    g.add_groups([[episode(4, 3, 1)]])                   # one usable episode starts the count again
    assert g.unusable_run(1) == ""
    failed = {"env_failure": "EnvFailure: start page http://127.0.0.1:9/ did not load"}
    g.add_groups([[episode(5 + i, 4, 0, env_failed=True, info=failed) for i in range(2)]])
    why = g.unusable_run(2)
    assert why.startswith("the last 2 episodes all failed in the environment") and "did not load" in why
    g.add_groups([[episode(7, 5, 0, cut=True, info=CUT)]])
    assert "(1 cut)" in g.unusable_run(3)
    queued = g.counts_with_queued()      # what a run stopped now saw: the queued unusable episodes counted too
    assert (queued.cut_episodes, queued.cut_steps, queued.env_failed) == (5, 10, 2) and g.counts.cut_episodes == 0


def test_a_run_whose_last_n_groups_each_got_one_reward_is_told_the_likely_cause():
    g = BatchGatherer(consumer_batch_size=8, max_head_offpolicyness=1)
    ids = iter(range(1000))

    def group(rewards, **kw):
        gid = next(ids)
        return [episode(next(ids), gid, r, **kw) for r in rewards]

    g.add_groups([group([0, 0, 0]) for _ in range(2)])
    assert g.uniform_run(3) == "" and g.uniform_run(0) == ""
    g.add_groups([group([0, 0], env_failed=True)])        # nothing usable: neither extends nor ends the streak
    assert g.uniform_run(3) == ""
    g.add_groups([group([0, 0, 0])])
    why = g.uniform_run(3)
    assert why.startswith("the last 3 groups each got one reward (success rate 0% over their 9 episodes")
    assert "never satisfied" in why and "train.stop_after_uniform_groups=3" in why and "toy (3)" in why
    g.add_groups([group([1, 0, 0])])                      # a group that disagrees starts the count again
    assert g.uniform_run(1) == ""
    g.add_groups([group([1, 1, 1, 1]), group([1, 1], cut=True), group([1, 1])])
    assert "always satisfied" in g.uniform_run(2) and "success rate 100%" in g.uniform_run(2)
    g.add_groups([group([0, 0])])
    why = g.uniform_run(3)
    assert "success rate 75% over their 8 episodes" in why and "model.temperature" in why
    assert g.unusable_run(1) == ""                        # the other rule is untouched
