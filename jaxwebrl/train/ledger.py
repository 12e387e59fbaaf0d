"""Exactly-once reading of the ring buffer across trainer restarts.

The trainer checkpoints `ReadLedger.resume_point(pending)`: a buffer cursor from which re-reading yields every
episode not yet trained or dropped, plus the ids already consumed after that cursor. A restarted trainer builds
`ReadLedger(cursor, consumed)` and skips the consumed ones, so no episode is trained twice and none is skipped.
The losses the reads from that cursor on counted (`resume_point`'s "losses_read_again") are met and counted again
by the restarted trainer, so a checkpoint's running totals leave them out.
"""

from __future__ import annotations

import collections

from jaxwebrl.buffer.episode import Episode


def _id(episode: Episode) -> int:
    return episode.episode_id


class ReadLedger:
    """Which buffer reads delivered which episodes, to checkpoint an exactly-once resume point."""

    def __init__(self, cursor, consumed: list[int] | None = None):
        self.cursor = cursor                         # next read starts here
        self._reads: collections.deque = collections.deque()   # (cursor before read, [episode ids], its losses)
        self._skip = set(consumed or ())             # consumed before a restart: ignore when re-read

    def record(self, cursor_before, cursor_after, groups: list[list[Episode]],
               losses: dict[str, int] | None = None) -> list[list[Episode]]:
        """Note one read of whole groups (and the episodes it counted lost, by kind); returns them minus the
        episodes a previous run already consumed (a group left empty is dropped)."""
        fresh = [kept for kept in ([e for e in group if _id(e) not in self._skip] for group in groups) if kept]
        self._reads.append((cursor_before, [_id(e) for group in fresh for e in group], dict(losses or {})))
        self.cursor = cursor_after
        return fresh

    def resume_point(self, pending_ids: set[int]) -> dict:
        """{"cursor": ..., "consumed": [...], "losses_read_again": {kind: n}}: re-reading from cursor and skipping
        consumed = the pending episodes; the reads from cursor on counted those losses (a resume counts them again)."""
        while self._reads and not (set(self._reads[0][1]) & pending_ids):
            self._reads.popleft()  # every episode of the oldest read is consumed: no need to re-read it
            self._skip.clear()     # the restored cursor is behind us now, and with it the old consumed ids
        if not self._reads:
            return {"cursor": self.cursor, "consumed": [], "losses_read_again": {}}
        delivered = {i for _, ids, _ in self._reads for i in ids}
        again = sum((collections.Counter(losses) for _, _, losses in self._reads), collections.Counter())
        return {"cursor": self._reads[0][0], "consumed": sorted((delivered - pending_ids) | self._skip),
                "losses_read_again": dict(again)}
