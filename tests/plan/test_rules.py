"""The fleet model's ported rules agree with the live loop's own classes on random states."""

import numpy as np

from jaxwebrl.buffer.episode import Episode, Step
from jaxwebrl.plan import rules
from jaxwebrl.rollout.admission import Admission
from jaxwebrl.train.gatherer import BatchGatherer


def test_admission_port_agrees_with_the_gate():
    rng = np.random.default_rng(0)
    for _ in range(300):
        group_size = int(rng.integers(1, 9))
        workers = int(rng.integers(1, 12))
        capacity = rules.admission_capacity(eta=int(rng.integers(0, 3)), batch=int(rng.integers(1, 64)),
                                            workers=workers, group_size=group_size)
        backlog = int(rng.integers(0, capacity + 8))
        gate = Admission(group_size, clock=lambda: 0.0)
        gate.set_limit(capacity, backlog)
        playing = [w for w in range(workers) if rng.random() < 0.5]
        gate._groups = {w: (1, 0.0) for w in playing}   # the gate's record of admitted groups, set directly
        asking = int(rng.integers(0, workers))
        others = len([w for w in playing if w != asking])
        assert gate._admits(asking) == rules.admits(backlog=backlog, running_others=others, group_size=group_size,
                                                    capacity=capacity)
    assert rules.admits(backlog=10**6, running_others=10**6, group_size=8, capacity=None)


def _episode(i, group, version, reward, failed=False):
    """A one-step Episode as the buffer reads it back (episode_id set; `min_version` = `version`)."""
    step = Step(input_ids=np.arange(3), loss_mask=np.array([0, 1, 1]),
                behave_logprobs=np.array([0, -0.5, -0.5], np.float32), versions=np.array([-1, version, version]))
    return Episode(steps=(step,), task_id="toy", group_id=group, reward=reward, env_failed=failed, episode_id=i)


def test_gatherer_port_agrees_with_the_batch_gatherer():
    rng = np.random.default_rng(1)
    batches = stale = uniform = 0
    for trial in range(60):
        batch, eta, dynamic = int(rng.integers(2, 17)), int(rng.integers(0, 3)), bool(rng.random() < 0.7)
        real = BatchGatherer(consumer_batch_size=batch, max_head_offpolicyness=eta, dynamic_sampling=dynamic)
        port = rules.Gatherer(batch=batch, eta=eta, dynamic_sampling=dynamic)
        version, next_id = 0, 0
        for _ in range(40):
            if rng.random() < 0.7:
                size = int(rng.integers(1, 5))
                made = int(rng.integers(max(version - 3, 0), version + 1))
                group = [_episode(next_id + k, trial * 1000 + next_id, made, float(rng.random() < 0.4),
                                  bool(rng.random() < 0.05)) for k in range(size)]
                next_id += size
                real.add_groups([group])
                port.add_group([rules.Episode(e.group_id, e.min_version, e.reward, 1, e.env_failed) for e in group])
            else:
                got, ported = real.pop_batch(version), port.pop_batch(version)
                assert (got is None) == (ported is None)
                if got is not None:
                    assert [e.min_version for e in got] == [e.min_version for e in ported]
                    assert [e.reward for e in got] == [e.reward for e in ported]
                    version += 1
                    batches += 1
            assert real.ready_trajectories() == port.ready_trajectories()
        c = real.counts
        assert (c.dropped_stale, c.dropped_uniform_groups, c.env_failed, c.groups_accepted) == (
            port.counts.dropped_stale, port.counts.dropped_uniform_groups, port.counts.env_failed,
            port.counts.groups_accepted)
        stale, uniform = stale + c.dropped_stale, uniform + c.dropped_uniform_groups
    assert batches > 20 and stale > 0 and uniform > 0   # every branch of the rule was met
