"""Commit protocol: slot reservation, the commit log, writer leases. All JSON, all compare-and-swap.

An append is (1) reserve step and screenshot sequence numbers with a CAS on `control/reserve`,
(2) write a lease naming the reservation, (3) write the rows and images (each one atomic key with
its own stamp), (4) publish a JSON commit record into the log with a conditional create. Only (4)
makes the episode visible, and it is one atomic key write, so a writer killed anywhere before it
leaves nothing visible; its reserved slots are simply reused when the ring comes round again.

The log is a ring of `log_capacity` keys holding consecutive sequence numbers without gaps: a writer
claims log seq n only by CAS-replacing the record n - log_capacity (or an empty slot when
n < log_capacity), and it only tries n after seeing n - 1 taken. A reader's cursor is therefore just
"the next log seq", and "missing or older record" means "not committed yet".
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
import uuid

import tensorstore as ts

from jaxwebrl.buffer.schema import BufferFormatError

RESERVE_KEY = "control/reserve"
LOG_PREFIX = "log/"
WRITERS_PREFIX = "writers/"


def _cas_failed(stamp) -> bool:
    """TensorStore reports an `if_equal` mismatch as an empty generation."""
    return stamp.generation == b""


def _backoff(attempt: int) -> None:
    time.sleep(min(0.02, 0.0002 * (2 ** min(attempt, 7))) * random.random())


class Reservations:
    """Global step / screenshot sequence counters; slot = seq % capacity."""

    def __init__(self, kv: ts.KvStore, where: str):
        self._kv = kv
        self._where = where

    def initialise(self) -> None:
        self._kv.write(RESERVE_KEY, json.dumps({"steps": 0, "shots": 0}).encode()).result()

    def _decode(self, result) -> dict:
        if result.state != "value":
            raise BufferFormatError(f"{self._where}/{RESERVE_KEY} is missing; the buffer is incomplete. "
                                    f"Recreate it with RingBuffer.create.")
        try:
            heads = json.loads(result.value)
            return {"steps": int(heads["steps"]), "shots": int(heads["shots"])}
        except (ValueError, KeyError, TypeError):
            raise BufferFormatError(f"{self._where}/{RESERVE_KEY} is corrupt ({result.value[:80]!r}); "
                                    f"recreate the buffer with RingBuffer.create.") from None

    def heads(self) -> dict:
        """{"steps": next step seq, "shots": next screenshot seq} (everything below is reserved)."""
        return self._decode(self._kv.read(RESERVE_KEY).result())

    def reserve(self, steps: int, shots: int) -> tuple[int, int]:
        """Atomically takes `steps` step seqs and `shots` screenshot seqs; returns their starts."""
        for attempt in range(10_000):
            current = self._kv.read(RESERVE_KEY).result()
            heads = self._decode(current)
            new = {"steps": heads["steps"] + steps, "shots": heads["shots"] + shots}
            stamp = self._kv.write(RESERVE_KEY, json.dumps(new).encode(),
                                   if_equal=current.stamp.generation).result()
            if not _cas_failed(stamp):
                return heads["steps"], heads["shots"]
            _backoff(attempt)
        raise RuntimeError(f"could not reserve slots in {self._where} after 10000 attempts: "
                           f"the kvstore keeps failing conditional writes")


class CommitLog:
    """Ring of JSON commit records, gapless in their `seq` field."""

    def __init__(self, kv: ts.KvStore, capacity: int, where: str):
        self._kv = kv
        self.capacity = int(capacity)
        self._where = where
        self._hint = 0  # a log seq such that every smaller seq is known to be taken

    def _key(self, seq: int) -> str:
        return f"{LOG_PREFIX}{seq % self.capacity:012d}"

    def _decode(self, result, slot_key: str):
        if result.state != "value":
            return None
        try:
            record = json.loads(result.value)
            int(record["seq"])
            return record
        except (ValueError, KeyError, TypeError):
            raise BufferFormatError(f"{self._where}/{slot_key} is not a valid commit record "
                                    f"({result.value[:80]!r}); the log is corrupt. Recreate the buffer "
                                    f"or delete that key to drop the episode.") from None

    def read_slot(self, seq: int):
        """Record stored in seq's slot (may be an older or newer seq), or None when empty."""
        key = self._key(seq)
        return self._decode(self._kv.read(key).result(), key)

    def read_range(self, start: int, count: int) -> list:
        """Records in the slots of seqs start..start+count-1, read concurrently."""
        keys = [self._key(s) for s in range(start, start + count)]
        futures = [self._kv.read(k) for k in keys]
        return [self._decode(f.result(), k) for f, k in zip(futures, keys)]

    def publish(self, record: dict) -> int:
        """Appends `record` (JSON-able, without "seq") at the next free seq; returns that seq."""
        seq = self._hint
        for attempt in range(100_000):
            key = self._key(seq)
            current = self._kv.read(key).result()
            existing = self._decode(current, key)
            if existing is not None and int(existing["seq"]) >= seq:
                seq = int(existing["seq"]) + 1  # taken (possibly laps ahead): everything below is too
                continue
            expected_old = seq - self.capacity
            found_old = -1 if existing is None else int(existing["seq"])
            if found_old != expected_old and not (existing is None and expected_old < 0):
                raise BufferFormatError(f"{self._where}: commit log slot {key} holds seq {found_old} where "
                                        f"{expected_old} or newer was expected; the log is corrupt "
                                        f"(recreate the buffer).")
            body = json.dumps(dict(record, seq=seq), separators=(",", ":")).encode()
            stamp = self._kv.write(key, body, if_equal=current.stamp.generation).result()
            if not _cas_failed(stamp):
                self._hint = seq + 1
                return seq
            _backoff(attempt)  # another writer took this seq; look at the slot again
        raise RuntimeError(f"could not publish a commit record in {self._where}: too much contention")

    def end(self) -> int:
        """The next unpublished seq (O(log capacity) reads: laps are found by binary search)."""
        first = self.read_slot(0)
        if first is None:
            return 0
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

    def __init__(self, kv: ts.KvStore):
        self._kv = kv
        self.writer_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._key = f"{WRITERS_PREFIX}{self.writer_id}"

    def record(self, **reservation) -> None:
        body = {"writer": self.writer_id, "host": socket.gethostname(), "pid": os.getpid(),
                "time": time.time(), **reservation}
        self._kv.write(self._key, json.dumps(body).encode()).result()


def read_leases(kv: ts.KvStore) -> list[dict]:
    keys = kv.list(ts.KvStore.KeyRange(WRITERS_PREFIX, WRITERS_PREFIX[:-1] + "0")).result()
    leases = []
    for key in keys:
        result = kv.read(key).result()
        if result.state == "value":
            try:
                leases.append(json.loads(result.value))
            except ValueError:
                continue
    return leases
