"""TensorStore plumbing: where a buffer lives (file / memory / any kvstore) and its two zarr3 arrays.

Backends and multi-writer support (the commit protocol needs atomic conditional writes, `if_equal`):
- `file` (a plain path or file://): many processes on one host or on a POSIX shared filesystem whose
  rename is atomic; TensorStore implements `if_equal` with lock files. Default.
- `memory` (memory://name): one process only (tests, notebooks). All handles share one context.
- `gcs` (gs://): many hosts; generation preconditions are native to GCS.
- `s3` and others: readers always work; several concurrent writers only where the driver supports
  conditional writes. A single writer process is always safe.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorstore as ts

_CONTEXTS: dict[tuple[str, bool], ts.Context] = {}


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


def open_kvstore(spec: dict, fsync: bool) -> ts.KvStore:
    return ts.KvStore.open(spec, context=_context(spec["driver"], fsync)).result()


def open_records_array(kv: ts.KvStore, subdir: str, records: int, itemsize: int, *, create: bool,
                       compress: bool, fsync: bool, driver: str) -> ts.TensorStore:
    """zarr3 uint8 [records, itemsize], one chunk (one kvstore key) per record."""
    codecs = [{"name": "bytes"}]
    if compress:
        codecs.append({"name": "zstd", "configuration": {"level": 1}})
    spec = {
        "driver": "zarr3",
        "metadata": {
            "shape": [records, itemsize],
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, itemsize]}},
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
    return ts.open(spec, kvstore=kv / subdir, context=_context(driver, fsync)).result()


def write_records(array: ts.TensorStore, slots: np.ndarray, records: np.ndarray) -> list:
    """Starts one write per record (`records` [n, itemsize] uint8); returns the futures."""
    return [array[int(s)].write(records[i]) for i, s in enumerate(slots)]


def read_records(array: ts.TensorStore, slots) -> list[np.ndarray]:
    """Reads records at `slots` concurrently; each comes back uint8 [itemsize]."""
    futures = [array[int(s)].read() for s in slots]
    return [f.result() for f in futures]
