"""The check of checkpoints saved with "crc32" digests (before `digests.py`'s device-side digest existed).

Such a checkpoint holds, per leaf, the CRC-32 (zlib) of each shard process 0 held (replica 0 of each), keyed by the
shard's global index. Here each held shard is hashed on the host (`np.asarray` copies it there on an accelerator);
a restore into another sharding finds other shard indices: where this process holds the whole leaf, the saved slices
are cut from it and checked; elsewhere those shards are not checked (nothing is claimed about them), never reported
as damaged. The shards the saving processes other than 0 held were never hashed.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np

CRC32_ALGORITHM = "crc32"


def first_crc32_mismatch(leaves: list[tuple[str, object]], saved: dict) -> str | None:
    """'leaf NAME (shard [INDEX]) ... CRC-32 x, saved y' of the first shard of `leaves` ((name, restored leaf) pairs
    whose dtype is the saved one) whose CRC-32 differs from `saved` ({name: {"shards": {index: crc}}}), else None."""
    for name, leaf in leaves:
        held = _shard_crcs(leaf)
        whole = not isinstance(leaf, jax.Array) or leaf.is_fully_addressable
        for index, saved_crc in saved[name]["shards"].items():
            crc = held.get(index)
            if crc is None and whole:   # restored in another sharding: cut the saved slice from the whole leaf
                crc = _crc32(np.asarray(leaf)[_index_slices(index)])
            if crc is not None and crc != saved_crc:
                return f"leaf {name} (shard [{index}]) differs from what was saved (CRC-32 {crc:08x}, saved " \
                       f"{int(saved_crc):08x})"
    return None


def _shard_crcs(leaf) -> dict[str, int]:
    """{global index of the shard: CRC-32 of its bytes} of the shards of one leaf this process holds (replica 0)."""
    if isinstance(leaf, jax.Array):
        shards = [(shard.index, shard.data) for shard in leaf.addressable_shards if shard.replica_id == 0]
    else:
        value = np.asarray(leaf)
        shards = [(tuple(slice(None, size) for size in value.shape), value)]
    return {_index_key(index, np.shape(leaf)): _crc32(data) for index, data in shards}


def _crc32(data) -> int:
    return zlib.crc32(np.ascontiguousarray(np.asarray(data)).reshape(-1).view(np.uint8))


def _index_key(index: tuple, shape: tuple) -> str:
    """'0:64,0:128' for the slices `index` of an array of `shape` ('' for a scalar)."""
    bounds = (s.indices(size)[:2] for s, size in zip(index, shape))
    return ",".join(f"{start}:{stop}" for start, stop in bounds)


def _index_slices(key: str) -> tuple:
    """The slices of an `_index_key`."""
    return tuple(slice(*map(int, bounds.split(":"))) for bounds in key.split(",") if bounds)
