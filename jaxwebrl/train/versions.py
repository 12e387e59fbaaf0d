"""Policy versions are never reused: not after a crash, not after a resume.

Every token in the ring buffer carries the version of the weights that produced it, and the staleness filter and the
decoupled importance weights trust that tag. A trainer that published v+1..H after its last checkpoint (at v) and
then died used to resume at v and publish v+1 again, with other weights: rollout workers still running
(launch/rollout.py) and episodes already in the buffer tagged v+1..H, by weights no checkpoint holds, then looked
fresh. So:

- every publish is recorded before its weights reach the policy server (WORKDIR/policy_versions.json, written
  atomically): {"published": the highest version ever published, "lost": [[first, last], ...]};
- a resumed trainer republishes its checkpoint's weights as their own version v, then numbers on past the highest
  version ever published (that record, or the newest episode the buffer holds past the resume point);
- the versions (v, H] a crash lost are remembered as lost, and the batch gatherer drops an episode holding a policy
  token of a lost version as stale (`holds_lost`); a lost range stops mattering once it is older than the staleness
  bound (its episodes are stale anyway) and is forgotten then.

    history = VersionHistory.resume(workdir, checkpoint_version=v, buffer_newest=n, max_offpolicyness=eta)
    version = history.next_after(version)   # the next publish's version (past every one published)
    history.publish(version)                # before set_weights: the record survives a crash that follows
    history.holds_lost(episode)             # True: some of its tokens came from weights a crash lost

The trainer builds it with `run_history` (process 0 reads, every process of a multi-host trainer gets the same).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from jaxwebrl.files import write_file_atomically
from jaxwebrl.parallel import distributed
from jaxwebrl.train.workdir import read_record

log = logging.getLogger(__name__)

RECORD = "policy_versions.json"


@dataclasses.dataclass
class VersionHistory:
    """The highest version ever published and the version ranges a crash lost ([first, last], inclusive).
    `path`: the record's file (None: nothing is written, the other processes of a multi-host trainer)."""

    published: int
    lost: tuple[tuple[int, int], ...] = ()
    path: str | None = None

    @classmethod
    def resume(cls, workdir: str, *, checkpoint_version: int, buffer_newest: int,
               max_offpolicyness: int) -> "VersionHistory":
        """The history of a run starting from a checkpoint at `checkpoint_version` (0 for a fresh run), whose buffer
        holds episodes up to version `buffer_newest` (-1: none) past its resume point. Versions above the checkpoint's
        that were published before (recorded, or in the buffer) are lost: no checkpoint holds their weights."""
        path = os.path.join(workdir, RECORD)
        record = read_record(path, f"delete it to let the run go on (versions are then numbered past the buffer's "
                                   f"newest episode, {buffer_newest})") or {}
        try:
            published = int(record.get("published", -1))
            lost = tuple((int(a), int(b)) for a, b in record.get("lost", ()))
        except (TypeError, ValueError):
            raise ValueError(f"{path}: 'published' must be an int and 'lost' a list of [first, last] pairs, got "
                             f"{record}: delete the file to let the run go on") from None
        start = int(checkpoint_version)
        highest = max(published, int(buffer_newest), start)
        if highest > start:
            log.warning("policy versions %d..%d were published after the checkpoint at version %d and are lost: "
                        "episodes holding their tokens are dropped as stale, new versions start at %d",
                        start + 1, highest, start, highest + 1)
            lost += ((start + 1, highest),)
        lost = tuple((a, b) for a, b in _merged(lost) if b >= start - int(max_offpolicyness))   # others: stale anyway
        return cls(highest, lost, path)   # written at the first publish (the checkpoint's weights, as `start`)

    def next_after(self, version: int) -> int:
        """The version the next publish after `version` gets: past every version ever published."""
        return max(int(version), self.published) + 1

    def publish(self, version: int) -> None:
        """Note that `version` is being published (written before its weights leave this process)."""
        self.published = max(self.published, int(version))
        if self.path is not None:
            body = {"published": self.published, "lost": [list(r) for r in self.lost]}
            write_file_atomically(self.path, [json.dumps(body).encode()], fsync=True)

    def holds_lost(self, episode) -> bool:
        """Whether `episode` (its min_version..max_version of policy tokens) may hold a token of a lost version."""
        return any(episode.min_version <= last and first <= episode.max_version for first, last in self.lost)

    def as_ints(self) -> list[int]:
        """[published, first_1, last_1, ...]: what process 0 broadcasts to the others (`from_ints`)."""
        return [self.published] + [v for r in self.lost for v in r]

    @classmethod
    def from_ints(cls, values) -> "VersionHistory":
        values = [int(v) for v in values]
        return cls(values[0], tuple(zip(values[1::2], values[2::2])))


def run_history(workdir: str, checkpoint_version: int, buffer, cursor, max_offpolicyness: int) -> VersionHistory:
    """The run's history (`VersionHistory.resume`) for a trainer restored at `checkpoint_version` whose buffer resumes
    at `cursor`: process 0 reads the record and the buffer, every other process gets the same history (their
    staleness filters must agree) and writes nothing."""
    history = None
    if distributed.is_primary():
        newest = buffer.newest_version(cursor)
        history = VersionHistory.resume(workdir, checkpoint_version=checkpoint_version, buffer_newest=newest,
                                        max_offpolicyness=max_offpolicyness)
    shared = distributed.broadcast_ints(None if history is None else history.as_ints())
    return history or VersionHistory.from_ints(shared)


def _merged(ranges) -> list[tuple[int, int]]:
    """Inclusive ranges, sorted, overlapping or adjacent ones joined."""
    out: list[list[int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return [tuple(r) for r in out]
