"""What the trainer trains on: whole groups of fresh, healthy episodes, `consumer_batch_size` trajectories at a time.

The ring buffer does the grouping (`RingBuffer.read(group_size=G)` hands out only whole groups: G episodes of one
task instance, same `group_id`, and counts the groups that can never complete). `BatchGatherer` queues those
groups and, when a batch is asked for, decides per group:

- env-failed episodes (the browser broke, not the agent) are excluded and counted; never scored 0;
- stale episodes (a policy token older than `current_version − max_head_offpolicyness`) are dropped and counted;
  staleness is judged at that moment, against the version the batch will train, so a group that waited too long
  is dropped too. It is the only staleness filter; it reads the episode's `min_version`, which the buffer
  computed once when the episode was appended;
- with dynamic sampling, a group whose remaining episodes all got the same reward (all success / all failure)
  carries no advantage signal and is dropped (counted);
- the rest are handed out, whole groups only, once at least `consumer_batch_size` trajectories are accepted.

Episodes are `jaxwebrl.buffer.episode.Episode`s as `RingBuffer.read` returns them (episode_id set).
"""

from __future__ import annotations

import collections
import dataclasses

from jaxwebrl.buffer.episode import Episode


def staleness(episode: Episode, current_version: int) -> int:
    """Policy versions between `current_version` and the oldest policy token of `episode`."""
    return int(current_version) - episode.min_version


@dataclasses.dataclass
class GatherCounts:
    """Running totals since the trainer started (logged as rollout/*)."""

    episodes_seen: int = 0
    successes_seen: int = 0            # of episodes_seen (env-failed ones never count as successes)
    env_failed: int = 0
    dropped_stale: int = 0
    dropped_uniform_groups: int = 0
    groups_accepted: int = 0


class BatchGatherer:
    """Filter and batch whole groups of episodes for the trainer (see the module docstring)."""

    def __init__(self, *, consumer_batch_size: int, max_head_offpolicyness: int, dynamic_sampling: bool = True):
        self.consumer_batch_size = consumer_batch_size
        self.max_head_offpolicyness = max_head_offpolicyness
        self.dynamic_sampling = dynamic_sampling
        self.counts = GatherCounts()
        self._ready: collections.deque[list[Episode]] = collections.deque()   # whole groups, arrival order

    def add_groups(self, groups: list[list[Episode]]) -> None:
        """Queue whole groups (as `RingBuffer.read(group_size=G)` returns them)."""
        for group in groups:
            for episode in group:
                self.counts.episodes_seen += 1
                if not episode.env_failed and episode.reward > 0:
                    self.counts.successes_seen += 1
            self._ready.append(list(group))

    def ready_trajectories(self) -> int:
        return sum(len(group) for group in self._ready)

    def pending_episode_ids(self) -> list[int]:
        """Episodes read but not yet trained or dropped, ascending."""
        return sorted(e.episode_id for group in self._ready for e in group)

    def pop_batch(self, current_version: int) -> list[Episode] | None:
        """Whole filtered groups totalling >= consumer_batch_size trajectories, or None while too few are ready."""
        accepted: list[list[Episode]] = []
        total = 0
        while self._ready and total < self.consumer_batch_size:
            group = self._filter(self._ready.popleft(), current_version)
            if group:
                accepted.append(group)
                total += len(group)
        if total < self.consumer_batch_size:
            for group in reversed(accepted):  # not enough yet: keep them, in order (filtering again is idempotent)
                self._ready.appendleft(group)
            return None
        self.counts.groups_accepted += len(accepted)
        return [episode for group in accepted for episode in group]

    def _filter(self, group: list[Episode], current_version: int) -> list[Episode]:
        kept = []
        for episode in group:
            if episode.env_failed:
                self.counts.env_failed += 1
            elif staleness(episode, current_version) > self.max_head_offpolicyness:
                self.counts.dropped_stale += 1
            else:
                kept.append(episode)
        if not kept:
            return []
        rewards = {e.reward for e in kept}
        if self.dynamic_sampling and (len(rewards) == 1 or len(kept) == 1):
            self.counts.dropped_uniform_groups += 1
            return []
        return kept
