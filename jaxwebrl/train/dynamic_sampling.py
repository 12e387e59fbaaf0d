"""What the trainer trains on: whole groups of fresh, healthy episodes, `consumer_batch_size` trajectories at a time.

Episodes arrive from the ring buffer one by one, in commit order, from many workers. `BatchGatherer` holds them
until their group (G episodes of one task instance, same `group_id`) is complete, then decides per group:

- env-failed episodes (the browser broke, not the agent) are excluded and counted; never scored 0;
- stale episodes (a policy token older than `current_version − max_head_offpolicyness`) are dropped and counted;
- with dynamic sampling, a group whose remaining episodes all got the same reward (all success / all failure)
  carries no advantage signal and is dropped (counted);
- the rest joins the queue; `pop_batch` hands out whole groups once at least `consumer_batch_size`
  trajectories are queued.

Episodes are dicts as `RingBuffer.read` returns them (docs/interfaces.md): per-step lists of arrays plus
`episode_id`, `group_id`, `reward`, `env_failed` (scalars or [S]).
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np


def episode_scalar(episode: dict, key: str):
    """A per-episode field stored as a scalar or repeated per step ([S]): its single value."""
    value = np.asarray(episode[key])
    return value.reshape(-1)[0].item() if value.ndim else value.item()


def oldest_version(episode: dict) -> int | None:
    """Smallest policy version over the episode's policy tokens (None when it has no policy token)."""
    oldest = None
    for versions, mask in zip(episode["versions"], episode["loss_mask"]):
        versions, mask = np.asarray(versions), np.asarray(mask).astype(bool)
        if mask.any():
            v = int(versions[mask].min())
            oldest = v if oldest is None else min(oldest, v)
    return oldest


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
    """Group, filter and batch episodes for the trainer (see the module docstring)."""

    def __init__(self, *, group_size: int, consumer_batch_size: int, max_head_offpolicyness: int,
                 dynamic_sampling: bool = True):
        self.group_size = group_size
        self.consumer_batch_size = consumer_batch_size
        self.max_head_offpolicyness = max_head_offpolicyness
        self.dynamic_sampling = dynamic_sampling
        self.counts = GatherCounts()
        self._open: dict[int, list[dict]] = collections.OrderedDict()   # group_id -> episodes so far
        self._ready: collections.deque[list[dict]] = collections.deque()  # complete groups, arrival order

    def add(self, episodes: list[dict]) -> None:
        """Take newly committed episodes; a group becomes complete when its G-th episode arrives."""
        for episode in episodes:
            self.counts.episodes_seen += 1
            if not bool(episode_scalar(episode, "env_failed")) and float(episode_scalar(episode, "reward")) > 0:
                self.counts.successes_seen += 1
            group_id = int(episode_scalar(episode, "group_id"))
            members = self._open.setdefault(group_id, [])
            members.append(episode)
            if len(members) >= self.group_size:
                self._ready.append(self._open.pop(group_id))

    def ready_trajectories(self) -> int:
        return sum(len(group) for group in self._ready)

    def pending_episode_ids(self) -> list[int]:
        """Episodes read but not yet trained or dropped (open and complete groups), in arrival order."""
        ids = [int(episode_scalar(e, "episode_id")) for members in self._open.values() for e in members]
        ids += [int(episode_scalar(e, "episode_id")) for group in self._ready for e in group]
        return sorted(ids)

    def pop_batch(self, current_version: int) -> list[dict] | None:
        """Whole filtered groups totalling >= consumer_batch_size trajectories, or None while too few are ready.

        Staleness is judged now, against `current_version`, so a group that waited too long is dropped.
        """
        accepted: list[list[dict]] = []
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

    def staleness(self, batch: list[dict], current_version: int) -> list[int]:
        """current_version − oldest token version, per episode of `batch`."""
        return [current_version - (oldest_version(e) if oldest_version(e) is not None else current_version)
                for e in batch]

    def _filter(self, group: list[dict], current_version: int) -> list[dict]:
        kept = []
        for episode in group:
            if bool(episode_scalar(episode, "env_failed")):
                self.counts.env_failed += 1
                continue
            oldest = oldest_version(episode)
            if oldest is not None and oldest < current_version - self.max_head_offpolicyness:
                self.counts.dropped_stale += 1
                continue
            kept.append(episode)
        if not kept:
            return []
        rewards = {float(episode_scalar(e, "reward")) for e in kept}
        if self.dynamic_sampling and (len(rewards) == 1 or len(kept) == 1):
            self.counts.dropped_uniform_groups += 1
            return []
        return kept
