"""TensorStore plumbing: where a buffer lives (file / memory / any kvstore) and its two zarr3 arrays.

Backends and multi-writer support (the commit protocol needs atomic conditional writes, `if_equal`):
- `file` (a plain path or file://): many processes on one host, or on a shared POSIX filesystem with
  atomic rename and working locks (NFS with lockd). Default. By default (`direct_file_io`) it is
  driven with POSIX calls and flock from the calling thread; otherwise TensorStore's file kvstore,
  which implements `if_equal` with its own lock files.
- `memory` (memory://name): one process only (tests, notebooks). All handles share one context.
- `gcs` (gs://): many hosts; generation preconditions are native to GCS.
- `s3` and others: readers always work; several concurrent writers only where the driver supports
  conditional writes. A single writer process is always safe.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
from typing import Any

import numpy as np
import tensorstore as ts

from jaxwebrl.buffer.control import KvControl, LocalControl, write_file_atomically
from jaxwebrl.buffer.schema import BufferWriteError
from jaxwebrl.errors import one_line

_CONTEXTS: dict[tuple[str, bool], ts.Context] = {}
# errno of a local chunk read that says the chunk itself is damaged (a media error, a broken filesystem entry); any
# other OSError (too many open files, memory, permissions) is a failure for now and raises
DAMAGED_ERRNOS = frozenset({errno.EIO, errno.ELOOP, errno.EISDIR, errno.EBADMSG, getattr(errno, "EUCLEAN", 117)})


def _context(driver: str, fsync: bool) -> ts.Context:
    """One shared context per (driver, fsync): memory stores must share it to see each other."""
    key = (driver, bool(fsync))
    if key not in _CONTEXTS:
        spec = {"file_io_sync": bool(fsync)} if driver == "file" else {}
        _CONTEXTS[key] = ts.Context(spec)
    return _CONTEXTS[key]


def kvstore_spec(path: Any) -> dict:
    """Normalises a buffer location to a kvstore JSON spec whose path ends in '/'.

    path: filesystem path (str/PathLike), URL ('memory://x', 'file:///x', 'gs://bucket/x'),
    or a TensorStore kvstore JSON spec dict.
    """
    if isinstance(path, ts.KvStore.Spec):
        spec = path.to_json()
    elif isinstance(path, dict):
        spec = dict(path)
    elif isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if "://" in text:
            spec = ts.KvStore.Spec(text if text.endswith("/") else text + "/").to_json()
        else:
            spec = {"driver": "file", "path": os.path.abspath(text)}
    else:
        raise TypeError(f"buffer path must be a path, a kvstore URL or a kvstore spec dict, got {type(path)}")
    if "driver" not in spec:
        raise ValueError(f"kvstore spec {spec} has no 'driver'; e.g. {{'driver': 'file', 'path': '/data/buf'}}")
    p = spec.get("path", "")
    if p and not p.endswith("/"):
        spec["path"] = p + "/"
    return spec


def describe(spec: dict) -> str:
    """Short human-readable location for error messages."""
    return f"{spec['driver']}:{spec.get('path', '')}".rstrip("/")


@contextlib.contextmanager
def writing(where: str):
    """Turns an OSError of the block (disk full, read-only, quota), or a TensorStore write that failed for now
    (FAILED_FOR_NOW: an outage, a quota or credentials on gs://), into a one-line BufferWriteError."""
    try:
        yield
    except BufferWriteError:
        raise
    except OSError as err:
        raise BufferWriteError(err.errno, f"cannot write the ring buffer at {where}: {err.strerror or err} "
                                          f"({err.filename or where}); free space on that disk or make it writable"
                               ) from None
    except ValueError as err:   # TensorStore's error for any failed write, its status code first
        if not failed_for_now(err):
            raise
        raise BufferWriteError(errno.EAGAIN, f"cannot write the ring buffer at {where}: {one_line(err, 300)}; "
                                             "it is retried (check the store's availability, quota and "
                                             "credentials)") from None


def open_kvstore(spec: dict, fsync: bool) -> ts.KvStore:
    return ts.KvStore.open(spec, context=_context(spec["driver"], fsync)).result()


def open_control(kv: ts.KvStore, spec: dict, fsync: bool, direct: bool):
    """Control-key store of the buffer: flock'd local files or TensorStore CAS (control.py)."""
    if direct and spec["driver"] == "file":
        return LocalControl(spec["path"], fsync)
    return KvControl(kv)


class RecordArray:
    """zarr3 uint8 [records, itemsize], one chunk (= one kvstore key, written atomically) per record.

    Writes and reads go through TensorStore, except that with `direct_file_io` on the local `file`
    driver the chunk files are written and read directly (the same bytes at the same keys, temp file +
    atomic rename like TensorStore's own file driver): this skips two copies of every multi-MB
    screenshot and TensorStore's per-write lock file, and TensorStore still reads the array as ordinary zarr3.
    """

    def __init__(self, array: ts.TensorStore, local_dir: str | None, itemsize: int, fsync: bool):
        self.array = array
        self.itemsize = itemsize
        self._local_dir = local_dir
        self._fsync = fsync

    @property
    def where(self) -> str:
        return self._local_dir or str(self.array.kvstore.spec().to_json().get("path", "memory"))

    def _chunk_path(self, slot: int) -> str:
        return os.path.join(self._local_dir, f"c.{int(slot)}.0")  # chunk_key_encoding separator "."

    def write(self, slot: int, parts: list) -> None:
        """Writes one record, given as byte buffers whose concatenation is itemsize bytes; durable on return."""
        if self._local_dir is None:
            self.array[int(slot)].write(np.concatenate([np.frombuffer(p, np.uint8) for p in parts])).result()
            return
        write_file_atomically(self._chunk_path(slot), parts, self._fsync)

    def write_many(self, slots, records: np.ndarray, in_flight: int) -> None:
        """Writes `records` [n, itemsize] uint8 at `slots` [n], at most `in_flight` at a time; durable on return."""
        if self._local_dir is not None:
            for slot, record in zip(slots, records):
                self.write(slot, [record])
            return
        pending = collections.deque()
        for i, slot in enumerate(slots):
            if len(pending) >= in_flight:
                pending.popleft().result()
            pending.append(self.array[int(slot)].write(records[i]))
        for future in pending:
            future.result()

    def read_into(self, slot: int, parts: list) -> bool:
        """Reads one record into writable buffers whose sizes add up to itemsize (zeros if never written);
        False when the chunk is damaged (short or undecodable: the rest is zero-filled)."""
        views = [memoryview(p).cast("B") for p in parts]
        if self._local_dir is None:
            record = _result_or_none(self.array[int(slot)].read())
            if record is None:   # damaged: TensorStore cannot decode it
                return _zero_filled(views)
            offset = 0
            for view in views:
                view[:] = record[offset:offset + len(view)]
                offset += len(view)
            return True
        try:
            fd = os.open(self._chunk_path(slot), os.O_RDONLY)
        except FileNotFoundError:
            for view in views:
                view[:] = bytes(len(view))
            return True
        except OSError as err:
            if err.errno not in DAMAGED_ERRNOS:
                raise
            return _zero_filled(views)
        try:
            got = os.preadv(fd, views, 0)
            total = sum(len(v) for v in views)
            while got < total:  # short reads are legal; finish the rest
                offset, rest = got, []
                for view in views:
                    if offset >= len(view):
                        offset -= len(view)
                        continue
                    rest.append(view[offset:])
                    offset = 0
                more = os.preadv(fd, rest, got)
                if more == 0:   # short chunk: damaged
                    return _zero_filled(rest)
                got += more
            return True
        except OSError as err:
            if err.errno not in DAMAGED_ERRNOS:
                raise
            return _zero_filled(views)
        finally:
            os.close(fd)

    def read_many(self, slots, in_flight: int) -> list[np.ndarray | None]:
        """The records at `slots`, each uint8 [itemsize] (zeros where never written; None where the chunk is
        damaged: the wrong size or unreadable)."""
        if self._local_dir is not None:
            out = []
            for slot in slots:
                try:
                    record = np.fromfile(self._chunk_path(slot), np.uint8)
                except FileNotFoundError:
                    record = np.zeros(self.itemsize, np.uint8)
                except OSError as err:
                    if err.errno not in DAMAGED_ERRNOS:
                        raise
                    record = None
                out.append(record if record is not None and record.size == self.itemsize else None)
            return out
        out, pending = [], collections.deque()
        for slot in slots:
            if len(pending) >= in_flight:
                out.append(_result_or_none(pending.popleft()))
            pending.append(self.array[int(slot)].read())
        return out + [_result_or_none(future) for future in pending]


# TensorStore raises ValueError for every failed read, its status code first (python/tensorstore/status.cc): these
# codes say the read failed for now (outage, quota, credentials), not that the chunk is damaged.
FAILED_FOR_NOW = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "CANCELLED", "UNAUTHENTICATED",
                  "PERMISSION_DENIED")


def _zero_filled(views) -> bool:
    """Zeros the buffers of a damaged chunk's record; False (read_into's answer for a damaged chunk)."""
    for view in views:
        view[:] = bytes(len(view))
    return False


def failed_for_now(err: BaseException) -> bool:
    """Whether a TensorStore error says its read or write failed for now (FAILED_FOR_NOW), not that data is bad."""
    return isinstance(err, ValueError) and str(err).startswith(FAILED_FOR_NOW)


def _result_or_none(future):
    """The future's record, or None when its chunk is damaged; a read that failed for now raises (nothing dropped)."""
    try:
        return future.result()
    except ValueError as err:   # an undecodable chunk, or any other failure
        if failed_for_now(err):
            raise
        return None


def open_records_array(kv: ts.KvStore, subdir: str, records: int, itemsize: int, *, create: bool,
                       fsync: bool, driver: str, direct: bool) -> RecordArray:
    """Creates or opens the zarr3 record array under `subdir` of the buffer root (raw bytes codec)."""
    codecs = [{"name": "bytes"}]
    spec = {
        "driver": "zarr3",
        "metadata": {
            "shape": [records, itemsize],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, itemsize]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
            "data_type": "uint8",
            "codecs": codecs,
            "fill_value": 0,
        },
    }
    if create:
        spec["create"] = True
        spec["delete_existing"] = True
    else:
        spec["open"] = True
    array = ts.open(spec, kvstore=kv / subdir, context=_context(driver, fsync)).result()
    local = None
    if direct and driver == "file" and array.chunk_layout.read_chunk.shape == (1, itemsize):
        local = os.path.join(kv.spec().to_json()["path"], subdir)
    return RecordArray(array, local, itemsize, fsync)
