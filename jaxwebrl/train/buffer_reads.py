"""The trainer's reads of the ring buffer: whole groups, what each read lost said in one line, an outage waited out.

    reads = BufferReads(buffer, group_size=G)
    result = reads.read(cursor)   # a buffer ReadResult; None while the store fails for now (an outage on gs://)
    reads.losses                  # running totals of the episodes lost, by kind (BUFFER_LOSSES; metrics)
    losses_of(result)             # the episodes one read lost, by kind (only the kinds it lost)

A read that fails for now (TensorStore's UNAVAILABLE, DEADLINE_EXCEEDED, quota or credential errors:
`storage.failed_for_now`) leaves the cursor where it was, so the next poll reads the same episodes again; one warning
says the outage began, one line that it ended. An outage longer than `outage_limit_s` stops the run with
BufferUnreadable (a rerun resumes from the last checkpoint: nothing is lost).
"""

from __future__ import annotations

import collections
import logging
import time

from jaxwebrl.buffer.storage import failed_for_now
from jaxwebrl.errors import one_line

log = logging.getLogger(__name__)

BUFFER_LOSSES = {          # read stat -> what it means for the user
    "overwritten": "overwritten in the ring before they were read (raise buffer.capacity_steps)",
    "lost": "whose commit records were lapped before they were read (raise buffer.capacity_steps)",
    "incomplete": "in groups that can never complete (their worker died mid-group, or the group waited too long)",
    "corrupt": "damaged on disk (checksum mismatch; python -m jaxwebrl.buffer.inspect lists them)",
    "surplus": "beyond their group's env.group_size (a worker replayed a slot whose episode had landed)",
}
OUTAGE_LIMIT_S = 900.0


def losses_of(result) -> dict[str, int]:
    """{kind: episodes} that one buffer read (a ReadResult) lost, for the kinds of BUFFER_LOSSES it lost any of."""
    return {k: int(result.stats.get(k, 0)) for k in BUFFER_LOSSES if result.stats.get(k, 0)}


class BufferUnreadable(RuntimeError):
    """The ring buffer's store kept failing reads for longer than the outage limit."""


class BufferReads:
    """`read(cursor)` of whole groups of `group_size`, counting losses and waiting out an outage (module docstring)."""

    def __init__(self, buffer, group_size: int, *, outage_limit_s: float = OUTAGE_LIMIT_S, clock=time.monotonic):
        self.buffer, self.group_size = buffer, int(group_size)
        self.outage_limit_s, self.clock = float(outage_limit_s), clock
        self.losses = collections.Counter({k: 0 for k in BUFFER_LOSSES})
        self._outage_since: float | None = None

    def read(self, cursor):
        try:
            result = self.buffer.read(cursor, group_size=self.group_size)
        except ValueError as err:
            if not failed_for_now(err):
                raise
            return self._outage(err)
        if self._outage_since is not None:
            log.info("ring buffer readable again after %.0f s", self.clock() - self._outage_since)
            self._outage_since = None
        lost = losses_of(result)
        if lost:
            self.losses.update(lost)
            log.warning("ring buffer read: %s", "; ".join(f"{n} episodes {BUFFER_LOSSES[k]}" for k, n in lost.items()))
        return result

    def _outage(self, err: ValueError) -> None:
        now = self.clock()
        if self._outage_since is None:
            self._outage_since = now
            log.warning("ring buffer read failed for now (%s); reading again at the next poll", one_line(err, 200))
        elif now - self._outage_since > self.outage_limit_s:
            raise BufferUnreadable(f"the ring buffer could not be read for {now - self._outage_since:.0f} s (last: "
                                   f"{one_line(err, 200)}): check the store's availability, quota and credentials, "
                                   "then rerun the same command to resume from the last checkpoint") from None
        return None
