"""The live loop's two scheduling rules, ported for the fleet model (pure functions of plain state):

- the admission gate (`rollout/admission.py` `Admission._admits`, capacity from `train/trainer.py`
  `_publish_admission`): a worker's new group is admitted while `backlog + G · running_others < capacity`,
  capacity = max((η + 1) · B, W · G);
- the gatherer's consumption rule (`train/gatherer.py` `BatchGatherer.pop_batch` / `_filter`): whole groups in
  arrival order; env-failed episodes excluded, episodes with `version − min_version > η` dropped as stale, with
  dynamic sampling a group whose kept episodes share one reward (or only one is kept) dropped; a batch once at
  least B trajectories are accepted, otherwise the accepted groups go back, in order.

A faithful port, not an import: `Admission` blocks a thread and `BatchGatherer` sits in train/ (a sibling at
layer 4), while the model is single-threaded over light records. tests/plan/test_rules.py drives the real classes
and these side by side on random states; if the rules move there, that test fails (both are pure enough to be
extracted as shared functions later).
"""

from __future__ import annotations

import collections
import dataclasses


def admission_capacity(*, eta: int, batch: int, workers: int, group_size: int) -> int:
    """Trajectories allowed in flight or waiting: (η + 1) · B, never fewer than one group a worker."""
    return max((eta + 1) * batch, workers * group_size)


def admits(*, backlog: int, running_others: int, group_size: int, capacity: int | None) -> bool:
    """Whether a worker's new group may start (no capacity set yet: everything is admitted)."""
    return capacity is None or backlog + group_size * running_others < capacity


@dataclasses.dataclass
class Episode:
    """One played episode as the trainer sees it: its oldest policy version, reward and step rows."""

    group_id: int
    min_version: int
    reward: float
    steps: int
    env_failed: bool = False


@dataclasses.dataclass
class Counts:
    dropped_stale: int = 0
    dropped_uniform_groups: int = 0
    env_failed: int = 0
    groups_accepted: int = 0


class Gatherer:
    """`BatchGatherer`'s queue and filter over `Episode` records (see the module docstring)."""

    def __init__(self, *, batch: int, eta: int, dynamic_sampling: bool):
        self.batch, self.eta, self.dynamic_sampling = int(batch), int(eta), bool(dynamic_sampling)
        self.counts = Counts()
        self._ready: collections.deque[list[Episode]] = collections.deque()

    def add_group(self, group: list[Episode]) -> None:
        self._ready.append(list(group))

    def ready_trajectories(self) -> int:
        return sum(len(group) for group in self._ready)

    def pop_batch(self, version: int) -> list[Episode] | None:
        """Whole filtered groups totalling >= batch trajectories, or None while too few are ready."""
        accepted, total = [], 0
        while self._ready and total < self.batch:
            group = self._filter(self._ready.popleft(), version)
            if group:
                accepted.append(group)
                total += len(group)
        if total < self.batch:
            for group in reversed(accepted):
                self._ready.appendleft(group)
            return None
        self.counts.groups_accepted += len(accepted)
        return [episode for group in accepted for episode in group]

    def _filter(self, group: list[Episode], version: int) -> list[Episode]:
        kept = []
        for episode in group:
            if episode.env_failed:
                self.counts.env_failed += 1
            elif version - episode.min_version > self.eta:
                self.counts.dropped_stale += 1
            else:
                kept.append(episode)
        if not kept:
            return []
        if self.dynamic_sampling and (len({e.reward for e in kept}) == 1 or len(kept) == 1):
            self.counts.dropped_uniform_groups += 1
            return []
        return kept
