"""Small control keys (counters, commit records, leases): read, write, and atomic read-modify-write.

Two implementations of one interface:
- KvControl: any TensorStore kvstore; `update` is optimistic: read, compute, write with `if_equal`
  (the generation read), retry on conflict. Multi-writer wherever the driver honours `if_equal`.
- LocalControl: the local `file` driver, in the calling thread: `update` holds an exclusive flock on
  a lock file while it reads and atomically replaces (temp + rename) the key. No thread hand-offs,
  which matters on a busy host where every hand-off waits for a time slice. flock works across
  processes on one host and on NFS (Linux maps it to POSIX byte-range locks there).
Readers never lock: every write is an atomic whole-key replacement.
"""

from __future__ import annotations

import fcntl
import os
import random
import threading
import time
from typing import Callable

import tensorstore as ts

from jaxwebrl.files import write_file_atomically


class Abort(Exception):
    """Raised by an `update` function to leave the key unchanged; carries a value for the caller."""

    def __init__(self, value=None):
        super().__init__(value)
        self.value = value


def _backoff(attempt: int) -> None:
    time.sleep(min(0.02, 0.0002 * (2 ** min(attempt, 7))) * random.random())


class KvControl:
    """Control keys on a TensorStore kvstore."""

    def __init__(self, kv: ts.KvStore):
        self._kv = kv

    def read(self, key: str) -> bytes | None:
        result = self._kv.read(key).result()
        return result.value if result.state == "value" else None

    def read_many(self, keys: list[str]) -> list[bytes | None]:
        futures = [self._kv.read(k) for k in keys]
        return [r.value if r.state == "value" else None for r in (f.result() for f in futures)]

    def write(self, key: str, value: bytes) -> None:
        self._kv.write(key, value).result()

    def update(self, key: str, fn: Callable[[bytes | None], bytes], lock: str) -> bytes:
        """Atomically replaces key's value v by fn(v) and returns the new value; fn may raise Abort."""
        del lock  # optimistic concurrency needs no lock
        for attempt in range(100_000):
            current = self._kv.read(key).result()
            new = fn(current.value if current.state == "value" else None)
            stamp = self._kv.write(key, new, if_equal=current.stamp.generation).result()
            if stamp.generation != b"":  # an if_equal mismatch comes back as an empty generation
                return new
            _backoff(attempt)
        raise RuntimeError(f"could not update {key}: the kvstore keeps failing conditional writes")

    def list(self, prefix: str) -> list[str]:
        keys = self._kv.list(ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))).result()
        return [k.decode() for k in keys]


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


class LocalControl:
    """Control keys as files under `root` (the buffer directory), updated under flock."""

    def __init__(self, root: str, fsync: bool):
        self._root = root
        self._fsync = fsync

    def _path(self, key: str) -> str:
        return os.path.join(self._root, key)

    def read(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def read_many(self, keys: list[str]) -> list[bytes | None]:
        return [self.read(k) for k in keys]

    def write(self, key: str, value: bytes) -> None:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_file_atomically(path, [value], self._fsync)

    def update(self, key: str, fn: Callable[[bytes | None], bytes], lock: str) -> bytes:
        """Atomically replaces key's value v by fn(v) under the named lock; fn may raise Abort."""
        lock_path = self._path(os.path.join("locks", lock))
        with _THREAD_LOCKS_GUARD:
            thread_lock = _THREAD_LOCKS.setdefault(lock_path, threading.Lock())
        with thread_lock:
            os.makedirs(os.path.dirname(lock_path), exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                new = fn(self.read(key))
                self.write(key, new)
                return new
            finally:
                os.close(fd)  # releases the flock

    def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        return [prefix + n for n in sorted(names) if ".__tmp" not in n]
