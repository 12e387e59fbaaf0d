"""What the trainer trains on: whole groups of fresh, healthy episodes, `consumer_batch_size` trajectories at a time.

The ring buffer does the grouping (`RingBuffer.read(group_size=G)` hands out only whole groups: G episodes of one
task instance, same `group_id`, and counts the groups that can never complete). `BatchGatherer` queues those
groups and, when a batch is asked for, decides per group:

- env-failed episodes (the browser broke, not the agent) and cut ones (a step outgrew `buffer.max_seq_len`) are
  excluded and counted; never scored 0;
- stale episodes (a policy token older than `current_version − max_head_offpolicyness`, or of a version whose
  weights a trainer crash lost: `lost_versions`, train/versions.py) are dropped and counted;
  staleness is judged at that moment, against the version the batch will train, so a group that waited too long
  is dropped too. It is the only staleness filter; it reads the episode's `min_version`, which the buffer
  computed once when the episode was appended;
- with dynamic sampling, a group whose remaining episodes all got the same reward (all success / all failure)
  carries no advantage signal and is dropped (counted);
- the rest are handed out, whole groups only, once at least `consumer_batch_size` trajectories are accepted.

`unusable_run(n)` says why the run cannot train when the last `n` episodes read were all cut or env-failed (the
trainer's stop rule, `train.stop_after_unusable_episodes`); `uniform_run(n)` when the last `n` groups read each got
one reward (all success or all failure: no group carries an advantage signal, `train.stop_after_uniform_groups`),
naming the likely cause from their success rate.

Episodes are `jaxwebrl.buffer.episode.Episode`s as `RingBuffer.read` returns them (episode_id set).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

from jaxwebrl.buffer.episode import Episode
from jaxwebrl.train.judge_metrics import JudgeTally


def staleness(episode: Episode, current_version: int) -> int:
    """Policy versions between `current_version` and the oldest policy token of `episode`."""
    return int(current_version) - episode.min_version


TOTALS = {"env_failed": "rollout/env_failed", "cut_episodes": "rollout/cut_episodes", "cut_steps": "rollout/cut_steps",
          "dropped_stale": "rollout/dropped_stale", "dropped_uniform_groups": "rollout/dropped_uniform_groups",
          "episodes_seen": "rollout/episodes_seen"}   # GatherCounts field -> its metric


@dataclasses.dataclass
class GatherCounts:
    """Running totals of the run (logged as rollout/*; a resume goes on from its checkpoint's: train/totals.py)."""

    episodes_seen: int = 0
    successes_seen: int = 0            # of episodes_seen (env-failed and cut ones never count as successes)
    env_failed: int = 0
    cut_episodes: int = 0              # excluded: a step outgrew buffer.max_seq_len
    cut_steps: int = 0                 # the steps those cut episodes played (not trained)
    dropped_stale: int = 0
    dropped_uniform_groups: int = 0
    groups_accepted: int = 0
    judge: JudgeTally = dataclasses.field(default_factory=JudgeTally)   # judge/* of judged episodes

    def as_metrics(self) -> dict[str, float]:
        """The running totals a metrics.jsonl record carries (every step's, and the record of a run stopped at 0)."""
        return {**{metric: getattr(self, field) for field, metric in TOTALS.items()}, **self.judge.as_metrics()}


class BatchGatherer:
    """Filter and batch whole groups of episodes for the trainer (see the module docstring)."""

    def __init__(self, *, consumer_batch_size: int, max_head_offpolicyness: int, dynamic_sampling: bool = True,
                 lost_versions: Callable[[Episode], bool] = lambda episode: False):
        self.consumer_batch_size = consumer_batch_size
        self.max_head_offpolicyness = max_head_offpolicyness
        self.lost_versions = lost_versions   # True: the episode holds tokens of weights a crash lost (versions.py)
        self.dynamic_sampling = dynamic_sampling
        self.counts = GatherCounts()
        self._ready: collections.deque[list[Episode]] = collections.deque()   # whole groups, arrival order
        # unusable (cut or env-failed) episodes read in a row: (how many, how many of them cut, the last env
        # failure's and the last cut's details with the task)
        self._unusable: tuple[int, int, dict] = (0, 0, {})
        self._uniform = UniformStreak()

    def add_groups(self, groups: list[list[Episode]]) -> None:
        """Queue whole groups (as `RingBuffer.read(group_size=G)` returns them)."""
        for group in groups:
            for episode in group:
                self.counts.episodes_seen += 1
                self.counts.judge.note(episode)
                unusable = episode.env_failed or episode.cut
                if not unusable and episode.reward > 0:
                    self.counts.successes_seen += 1
                self._note_usable(episode, unusable)
            self._uniform.note(group)
            self._ready.append(list(group))

    def _note_usable(self, episode: Episode, unusable: bool) -> None:
        if not unusable:
            self._unusable = (0, 0, {})
            return
        streak, cut, last = self._unusable
        last = dict(last, task_id=episode.task_id)
        if episode.cut:
            last["cut"] = episode.info.get("cut")
        else:
            last["env_failure"] = episode.info.get("env_failure")
        self._unusable = (streak + 1, cut + int(episode.cut), last)

    def ready_trajectories(self) -> int:
        return sum(len(group) for group in self._ready)

    def pending_episodes(self) -> list[Episode]:
        """Episodes read but not yet trained or dropped, in reading order."""
        return [e for group in self._ready for e in group]

    def counts_with_queued(self) -> GatherCounts:
        """The counts with the cut and env-failed episodes still queued counted too (they are counted when a batch
        filters them out): what a run that stops before its next batch saw."""
        queued = self.pending_episodes()
        cut = [e for e in queued if e.cut]
        return dataclasses.replace(self.counts, cut_episodes=self.counts.cut_episodes + len(cut),
                                   cut_steps=self.counts.cut_steps + sum(e.num_steps for e in cut),
                                   env_failed=self.counts.env_failed + sum(e.env_failed and not e.cut for e in queued))

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

    def unusable_run(self, n: int) -> str:
        """Why the run cannot train ("" when it can, or `n` is 0): the last `n` episodes read were all cut, or all
        env-failed (a mix of the two says both); one line naming the cause, the last one's details and the knob."""
        streak, cut, last = self._unusable
        if n <= 0 or streak < n:
            return ""
        knob = f"train.stop_after_unusable_episodes={n} stops a run whose last {n} episodes are all unusable"
        if cut == streak:
            where = last.get("cut") or {}
            return (f"the last {streak} episodes were all cut: a step of {last['task_id']} outgrew the buffer (step "
                    f"{where.get('step')}: {where.get('tokens')} tokens > buffer.max_seq_len="
                    f"{where.get('max_seq_len')}): raise --config.buffer.max_seq_len, or shorten the prompt "
                    f"(env.prompt_window, env.screenshot_*, model.max_new_tokens); {knob}")
        mix = f" or were cut ({cut} cut)" if cut else ""
        failure = " ".join(str(last.get("env_failure") or "unknown").split())[:300]
        return (f"the last {streak} episodes all failed in the environment{mix}; last failure on "
                f"{last['task_id']}: {failure}: fix that cause (python -m jaxwebrl.env.check checks the browser); "
                f"{knob}")

    def uniform_run(self, n: int) -> str:
        """Why the run cannot learn ("" when it can, or `n` is 0): the last `n` groups read each got one reward."""
        return self._uniform.why(n)

    def _filter(self, group: list[Episode], current_version: int) -> list[Episode]:
        kept = []
        for episode in group:
            if episode.cut:
                self.counts.cut_episodes += 1
                self.counts.cut_steps += episode.num_steps
            elif episode.env_failed:
                self.counts.env_failed += 1
            elif staleness(episode, current_version) > self.max_head_offpolicyness:
                self.counts.dropped_stale += 1
            elif self.lost_versions(episode):   # its version looks recent, but a crash lost those weights
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


@dataclasses.dataclass
class UniformStreak:
    """Groups read in a row whose usable episodes (not cut, not env-failed) all got one reward, with their
    episodes, successes and tasks. A group with no usable episode neither extends nor ends the streak (the
    unusable-episode rule speaks for those); one with two rewards ends it."""

    groups: int = 0
    episodes: int = 0
    successes: int = 0
    tasks: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def note(self, group: list[Episode]) -> None:
        usable = [e for e in group if not (e.env_failed or e.cut)]
        if not usable:
            return
        if len({e.reward for e in usable}) > 1:
            self.groups, self.episodes, self.successes, self.tasks = 0, 0, 0, collections.Counter()
            return
        self.groups += 1
        self.episodes += len(usable)
        self.successes += sum(e.reward > 0 for e in usable)
        self.tasks[usable[0].task_id] += 1

    def why(self, n: int) -> str:
        if n <= 0 or self.groups < n:
            return ""
        rate = self.successes / self.episodes
        if self.successes == 0:
            cause = ("every episode failed: an evaluator that is never satisfied (check the task's evaluator and "
                     "its start page), or tasks out of this policy's reach")
        elif self.successes == self.episodes:
            cause = ("every episode succeeded: an evaluator that is always satisfied (check the task's evaluator), "
                     "or tasks already learned (train.stop_at_success ends such a run)")
        else:
            cause = ("each instance's G episodes always end the same way: raise model.temperature or "
                     "env.group_size so a group can disagree")
        tasks = ", ".join(f"{task} ({k})" for task, k in self.tasks.most_common(3))
        more = f" and {len(self.tasks) - 3} more" if len(self.tasks) > 3 else ""
        return (f"the last {self.groups} groups each got one reward (success rate {rate:.0%} over their "
                f"{self.episodes} episodes; tasks {tasks}{more}), so none carries an advantage signal: {cause}; "
                f"train.stop_after_uniform_groups={n} stops a run whose last {n} groups are all uniform (0: never)")
