"""Streaming safetensors reader/writer on plain file I/O: one tensor in host memory at a time.

The format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the
raw little-endian tensor bytes. Reading never memory-maps the whole file, so peak host memory while loading a
checkpoint is about one tensor (plus its transformed copy), whatever the checkpoint size.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable, Iterator

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class SafetensorsFile:
    """Random access to the tensors of one .safetensors file; `read(name)` -> a fresh NumPy array."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        self.metadata = header.pop("__metadata__", {}) or {}
        self.entries = header
        self.data_start = 8 + length

    def keys(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name]["shape"])

    def read(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        if entry["dtype"] not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        buffer = bytearray(end - begin)
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            if f.readinto(buffer) != len(buffer):
                raise IOError(f"{self.path}: truncated data for tensor {name}")
        return np.frombuffer(buffer, dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def write_file(path: str, tensors: Iterable[tuple[str, tuple[int, ...], np.dtype]], fetch, metadata=None) -> None:
    """Write tensors to `path`, fetching each array only when it is written.

    tensors: (name, shape, dtype) for every tensor, in file order; fetch(name) -> np.ndarray of that shape.
    """
    entries, offset = {}, 0
    layout = list(tensors)
    for name, shape, dtype in layout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        entries[name] = {"dtype": _NAMES[np.dtype(dtype)], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = {"__metadata__": dict(metadata or {"format": "pt"}), **entries}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, dtype in layout:
            array = np.ascontiguousarray(fetch(name), dtype=dtype)
            if array.shape != tuple(shape):
                raise ValueError(f"tensor {name}: expected shape {tuple(shape)}, got {array.shape}")
            f.write(array.tobytes())
    os.replace(tmp, path)


def checkpoint_files(hf_dir: str) -> dict[str, str]:
    """Tensor name -> file path for a (possibly sharded) HF checkpoint directory."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(hf_dir, file) for name, file in weight_map.items()}
    single = os.path.join(hf_dir, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(
            f"no model.safetensors or model.safetensors.index.json in {hf_dir}: point at a Hugging Face "
            "checkpoint directory saved with safetensors (save_pretrained(..., safe_serialization=True))"
        )
    return {name: single for name in SafetensorsFile(single).keys()}


def _entry_nbytes(entry: dict) -> int:
    begin, end = entry["data_offsets"]
    return end - begin


def iter_tensors(hf_dir: str) -> Iterator[tuple[str, SafetensorsFile]]:
    """(tensor name, open file) for every tensor, largest first.

    Largest first keeps peak host memory near the checkpoint size: the big transient copies happen while
    little else is loaded, and the tensors read last are small.
    """
    handles: dict[str, SafetensorsFile] = {}
    rows = []
    for name, path in checkpoint_files(hf_dir).items():
        handle = handles.setdefault(path, SafetensorsFile(path))
        if name not in handle.entries:
            raise ValueError(f"{path}: index lists tensor {name} but the file does not hold it")
        rows.append((_entry_nbytes(handle.entries[name]), name, handle))
    for _, name, handle in sorted(rows, key=lambda row: (-row[0], row[1])):
        yield name, handle


def return_freed_buffers_to_os() -> None:
    """Make glibc hand large freed buffers back to the OS at once (fixed 1 MiB mmap threshold).

    Without it, glibc's adaptive threshold keeps freed tensor-sized buffers on the heap, and the resident
    size after a streamed load stays well above the checkpoint size. No-op off glibc.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass
