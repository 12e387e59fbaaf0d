"""Per-leaf digests of a training checkpoint's arrays: Orbax checksums no array data, so a bit flipped in a saved
array would restore silently.

    digests = leaf_digests(state)          # at save, before the arrays may be donated: JSON-able
    check_digests(restored, digests)       # at restore: DigestMismatch naming the first leaf that differs

A digest is the CRC-32 (zlib) of each leaf's shards that this process holds (replica 0 of each), keyed by the leaf's
path and the shard's global index, so it needs no gather: on the CPU backend the shard is hashed in place; on an
accelerator `np.asarray` copies it to the host once. A restore into another sharding (another mesh) finds other
shard indices: where this process holds the whole leaf, the saved slices are cut from it and checked; elsewhere
those shards are not checked (nothing is claimed about them), never reported as damaged. Nor is a leaf restored in
another dtype (the restore casts, e.g. float32 params read into a bfloat16 policy): its bytes are not the saved ones.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np

DIGEST_ALGORITHM = "crc32"


class DigestMismatch(ValueError):
    """A restored leaf differs from what was saved: the checkpoint is damaged on disk."""


def _shard_digests(leaf) -> dict[str, int]:
    """{global index of the shard: CRC-32 of its bytes} of one leaf (a jax.Array or anything np.asarray takes)."""
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


def leaf_digests(tree) -> dict:
    """{"algorithm": "crc32", "leaves": {leaf path: {"dtype": name, "shards": {shard index: crc}}}} of every leaf of
    `tree`."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"algorithm": DIGEST_ALGORITHM,
            "leaves": {jax.tree_util.keystr(path): {"dtype": _dtype(leaf), "shards": _shard_digests(leaf)}
                       for path, leaf in leaves}}


def _dtype(leaf) -> str:
    return str(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype)


def check_digests(tree, digests: dict) -> None:
    """Raises DigestMismatch (one line, naming the leaf and its shard) when a shard of `tree` that `digests` (from
    `leaf_digests` at save) covers has another CRC-32, or `digests` is malformed."""
    try:
        saved = digests["leaves"]
        if digests["algorithm"] != DIGEST_ALGORITHM or not isinstance(saved, dict):
            raise TypeError(f"algorithm {digests['algorithm']!r}")
        if not all(isinstance(leaf, dict) and {"dtype", "shards"} <= leaf.keys() for leaf in saved.values()):
            raise TypeError("a leaf without its dtype and shards")
    except (KeyError, TypeError) as err:
        raise DigestMismatch(f"its leaf digests are malformed ({err})") from None
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        if name not in saved or saved[name]["dtype"] != _dtype(leaf):   # not saved, or cast by the restore
            continue
        held = _shard_digests(leaf)
        whole = not isinstance(leaf, jax.Array) or leaf.is_fully_addressable
        for index, saved_crc in saved[name]["shards"].items():
            crc = held.get(index)
            if crc is None and whole:   # restored in another sharding: cut the saved slice from the whole leaf
                crc = _crc32(np.asarray(leaf)[_index_slices(index)])
            if crc is not None and crc != saved_crc:
                raise DigestMismatch(f"leaf {name} (shard [{index}]) differs from what was saved (CRC-32 "
                                     f"{crc:08x}, saved {int(saved_crc):08x}): damaged on disk")
