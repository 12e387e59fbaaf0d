"""Commit protocol: slot reservation, the commit log, writer leases. All JSON, all atomic updates.

An append is (1) reserve step and screenshot sequence numbers by an atomic update of `control/reserve`,
(2) write a lease naming the reservation, (3) write the rows and images (each one atomic key with
its own stamp), (4) publish a JSON commit record into the log by an atomic update. Only (4)
makes the episode visible, and it is one atomic key write, so a writer killed anywhere before it
leaves nothing visible; its reserved slots are simply reused when the ring comes round again.

The log is a ring of `log_capacity` keys holding consecutive sequence numbers without gaps: a writer
claims log seq n only by atomically replacing the record n - log_capacity (or an empty slot when
n < log_capacity), and it only tries n after seeing n - 1 taken. A reader's cursor is therefore just
"the next log seq", and "missing or older record" means "not committed yet" -- until seq n + 1 is seen taken: then
the record of n was damaged on disk (or its key deleted) and readers count its episode as corrupt and go on, and
the writer whose lap reaches that slot replaces it.
The atomic updates are compare-and-swap on a TensorStore kvstore or flock on local files (control.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import types
import uuid

from jaxwebrl.buffer.control import Abort
from jaxwebrl.buffer.schema import BufferFormatError

RESERVE_KEY = "control/reserve"
LOG_PREFIX = "log/"
WRITERS_PREFIX = "writers/"
RECORD_INT_FIELDS = ("seq", "episode_id", "first_step", "num_steps", "oldest_ref", "refs_width", "group_id")
# What the log reads for a slot whose bytes are no commit record (damaged on disk): an "older record" of no seq.
DAMAGED = types.MappingProxyType({"seq": -1, "damaged": True})

log = logging.getLogger(__name__)


class Reservations:
    """Global step / screenshot sequence counters; slot = seq % capacity."""

    def __init__(self, control, where: str):
        self._control = control
        self._where = where

    def initialise(self) -> None:
        self._control.write(RESERVE_KEY, json.dumps({"steps": 0, "shots": 0}).encode())

    def _decode(self, raw: bytes | None) -> dict:
        if raw is None:
            raise BufferFormatError(f"{self._where}/{RESERVE_KEY} is missing; the buffer is incomplete. "
                                    f"Recreate it with RingBuffer.create.")
        try:
            heads = json.loads(raw)
            return {"steps": int(heads["steps"]), "shots": int(heads["shots"])}
        except (ValueError, KeyError, TypeError):
            raise BufferFormatError(f"{self._where}/{RESERVE_KEY} is corrupt ({raw[:80]!r}); "
                                    f"recreate the buffer with RingBuffer.create.") from None

    def heads(self) -> dict:
        """{"steps": next step seq, "shots": next screenshot seq} (everything below is reserved)."""
        return self._decode(self._control.read(RESERVE_KEY))

    def reserve(self, steps: int, shots: int) -> tuple[int, int]:
        """Atomically takes `steps` step seqs and `shots` screenshot seqs; returns their starts."""
        def bump(raw):
            heads = self._decode(raw)
            return json.dumps({"steps": heads["steps"] + steps, "shots": heads["shots"] + shots}).encode()
        new = json.loads(self._control.update(RESERVE_KEY, bump, lock="reserve"))
        return new["steps"] - steps, new["shots"] - shots


class CommitLog:
    """Ring of JSON commit records, gapless in their `seq` field."""

    def __init__(self, control, capacity: int, where: str):
        self._control = control
        self.capacity = int(capacity)
        self._where = where
        self._hint = 0  # a log seq such that every smaller seq is known to be taken

    def _key(self, seq: int) -> str:
        return f"{LOG_PREFIX}{seq % self.capacity:012d}"

    @staticmethod
    def _decode(raw: bytes | None):
        """The record of a slot's bytes; None when empty, DAMAGED when they are no commit record."""
        if raw is None:
            return None
        try:
            record = json.loads(raw)
            if not all(type(record[k]) is int for k in RECORD_INT_FIELDS) or not isinstance(record["task_id"], str):
                raise TypeError("fields")
            return record
        except (ValueError, KeyError, TypeError):
            return DAMAGED

    def read_slot(self, seq: int):
        """Record stored in seq's slot (may be an older or newer seq), None when empty, DAMAGED when unreadable."""
        return self._decode(self._control.read(self._key(seq)))

    def read_range(self, start: int, count: int) -> list:
        """Records in the slots of seqs start..start+count-1 (as read_slot)."""
        keys = [self._key(s) for s in range(start, start + count)]
        return [self._decode(raw) for raw in self._control.read_many(keys)]

    def taken_after(self, seq: int) -> bool:
        """Whether a seq after `seq` is already taken (then `seq` is taken too: the log is gapless)."""
        after = self.read_slot(seq + 1)
        return after is not None and int(after["seq"]) > seq

    def publish(self, record: dict) -> int:
        """Appends `record` (JSON-able, without "seq") at the next free seq; returns that seq."""
        seq = self._hint
        while True:
            key = self._key(seq)

            def claim(raw, seq=seq, key=key):
                existing = self._decode(raw)
                found = -1 if existing is None else int(existing["seq"])
                if found >= seq:
                    raise Abort(found)  # taken (possibly laps ahead): everything below is taken too
                if existing is None or existing is DAMAGED or found != seq - self.capacity:
                    # empty on the first lap, else no record of the lap before (damaged on disk or deleted); a later
                    # seq taken means this one was taken too (then damaged: readers count its episode as corrupt)
                    if self.taken_after(seq):
                        raise Abort(seq)
                    if existing is not None or seq >= self.capacity:
                        log.warning("%s: commit log slot %s held no commit record (damaged on disk or deleted; its "
                                    "episode is lost); seq %d replaces it", self._where, key, seq)
                return json.dumps(dict(record, seq=seq), separators=(",", ":")).encode()
            try:
                self._control.update(key, claim, lock="log")
            except Abort as taken:
                seq = taken.value + 1
                continue
            self._hint = seq + 1
            return seq

    def end(self) -> int:
        """The next unpublished seq (O(log capacity) reads: laps are found by binary search)."""
        first = self.read_slot(0)
        if first is None:
            return 0
        if first is DAMAGED:   # the next slot tells the lap (one seq short when slot 0 began a newer lap)
            first = self.read_slot(1) if self.capacity > 1 else None
            if first is None or first is DAMAGED:
                return 1
            first = {"seq": int(first["seq"]) - 1}
        lap_base = int(first["seq"])  # = k * capacity for the lap k now being written
        lo, hi = 1, self.capacity      # slots [1, lo) are known written in lap k; find first that is not
        while lo < hi:
            mid = (lo + hi) // 2
            rec = self.read_slot(mid)
            if rec is not None and int(rec["seq"]) == lap_base + mid:
                lo = mid + 1
            else:
                hi = mid
        return lap_base + lo


class Lease:
    """A writer's note of its current reservation, so `inspect` can tell orphans from in-flight work."""

    def __init__(self, control):
        self._control = control
        self.writer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._key = f"{WRITERS_PREFIX}{self.writer_id}"

    def record(self, **reservation) -> None:
        body = {"writer": self.writer_id, "host": socket.gethostname(), "pid": os.getpid(),
                "time": time.time(), **reservation}
        self._control.write(self._key, json.dumps(body).encode())


REMOTE_LEASE_SECONDS = 600.0  # a lease from another host counts as live this long after its last write


def writer_alive(lease: dict | None) -> bool:
    """Whether the writer of `lease` (see Lease) may still be running: its process exists on this host, or
    (another host) it wrote its lease within REMOTE_LEASE_SECONDS. No lease: not running."""
    if not lease:
        return False
    if lease.get("host") == socket.gethostname():
        try:
            os.kill(int(lease["pid"]), 0)
            return True
        except (ProcessLookupError, ValueError, KeyError, TypeError):
            return False
        except PermissionError:
            return True
    return time.time() - float(lease.get("time", 0)) < REMOTE_LEASE_SECONDS


def read_lease(control, writer_id: str) -> dict | None:
    """The lease a writer last wrote, or None (missing or unreadable)."""
    try:
        lease = json.loads(control.read(f"{WRITERS_PREFIX}{writer_id}") or b"null")
    except (TypeError, ValueError):
        return None
    return lease if isinstance(lease, dict) else None


def read_leases(control) -> list[dict]:
    leases = []
    for raw in control.read_many(control.list(WRITERS_PREFIX)):
        try:
            leases.append(json.loads(raw))
        except (TypeError, ValueError):
            continue
    return leases
