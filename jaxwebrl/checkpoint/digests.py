"""Per-leaf digests of a training checkpoint's arrays: Orbax checksums no array data, so a bit flipped in a saved
array would restore silently.

    digests = leaf_digests(state)          # at save, on every process, before the arrays may be donated: JSON-able
    check_digests(restored, digests)       # at restore: DigestMismatch naming the first leaf that differs
    digests["meta"] = meta_digest(meta)    # the step's JSON meta too: a flipped bit in a digit still parses
    check_meta(restored_meta, digests)     # at restore: DigestMismatch when it differs (none saved: not checked)

The digest ("fmix32-sum2") is computed on the devices that hold each leaf, by one jitted call for the whole tree:
each element's bits become a uint32 word w (a 2- or 1-byte dtype widened, an 8-byte one split in two words), and
each of two lanes sums, mod 2^32 over the whole leaf,

    mix(w + i * STEP)        i: the element's row-major index in the flattened leaf (mod 2^32), from per-axis iotas
                             (a sharded leaf is never reshaped, so never gathered); mix: a bijective 32-bit finaliser

Integer addition mod 2^32 is exact, associative and commutative, so the two uint32 scalars of a leaf are the same
whatever its sharding, mesh or process count: XLA reduces every shard on the device that holds it (all processes'
shards are covered) and only 8 bytes a leaf come to the host. What it detects: any change of one element (each lane
is a bijection of w for a given i: a flipped bit always changes both sums); two elements swapped, a block zeroed,
a shard written in another's place (mixed, position-keyed terms: missed with probability ~2^-64 a damage, where a
plain sum(w) and sum(i * w) pair misses x and -x swapped an even distance apart, which flips two sign bits).

A restore into another mesh or sharding is checked whole (every leaf, every shard). A leaf restored in another
dtype (the restore casts, e.g. float32 params read into a bfloat16 policy) is not: its bits are not the saved ones.
A checkpoint saved with "crc32" digests (process 0's shards, `crc32_digests.py`) is checked as it was then.
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxwebrl.checkpoint.crc32_digests import CRC32_ALGORITHM, first_crc32_mismatch

DIGEST_ALGORITHM = "fmix32-sum2"
# Per lane: the odd multiplier of the element's index, then the finaliser's (shift, multiplier, shift, multiplier,
# shift): MurmurHash3's fmix32 and Wellons' lowbias32, both bijections of uint32.
LANES = ((0x9E3779B9, (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16)),
         (0x632BE5AB, (16, 0x7FEB352D, 15, 0x846CA68B, 16)))


class DigestMismatch(ValueError):
    """A restored leaf differs from what was saved: the checkpoint is damaged on disk."""


def _words(leaf: jax.Array) -> jax.Array:
    """The bits of `leaf` as uint32 words: [*shape] (a 4-, 2- or 1-byte dtype, narrow ones widened), [*shape, 2]
    (an 8-byte dtype)."""
    if leaf.dtype == jnp.bool_:
        return leaf.astype(jnp.uint32)
    if leaf.dtype.itemsize == 8:
        return lax.bitcast_convert_type(leaf, jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[leaf.dtype.itemsize]
    return lax.bitcast_convert_type(leaf, unsigned).astype(jnp.uint32)


def _flat_index(shape: tuple) -> jax.Array:
    """[*shape] uint32: each element's row-major index in the flattened array, mod 2^32, summed from per-axis iotas
    (no reshape: a sharded array keeps its layout)."""
    index, stride = jnp.zeros(shape, jnp.uint32), 1
    for axis in reversed(range(len(shape))):
        index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
        stride *= shape[axis]
    return index


def _mix(x: jax.Array, finaliser: tuple) -> jax.Array:
    """A bijective xorshift-multiply finaliser of uint32 words (elementwise)."""
    shift1, mul1, shift2, mul2, shift3 = finaliser
    x = (x ^ (x >> shift1)) * jnp.uint32(mul1)
    x = (x ^ (x >> shift2)) * jnp.uint32(mul2)
    return x ^ (x >> shift3)


def _leaf_digest(leaf: jax.Array) -> jax.Array:
    """[2] uint32: the two lanes' sums of one leaf, in one pass over it (one variadic reduction; two `jnp.sum`s
    were two passes, and XLA's CPU backend ran them many times slower)."""
    words = _words(leaf)
    index = _flat_index(words.shape)
    lanes = tuple(_mix(words + index * jnp.uint32(step), finaliser) for step, finaliser in LANES)
    zeros = tuple(jnp.uint32(0) for _ in LANES)
    sums = lax.reduce(lanes, zeros, lambda a, b: tuple(x + y for x, y in zip(a, b)), tuple(range(words.ndim)))
    return jnp.stack(sums)


_leaf_digest_call = jax.jit(_leaf_digest)


@jax.jit
def _tree_digest(leaves: tuple) -> jax.Array:
    """[len(leaves), 2] uint32: the digest of every leaf, in one program (compiled once per structure). Each leaf's
    digest is a jitted call of its own, traced and lowered once per shape and dtype: a state's leaves repeat a few
    shapes (params, both Adam moments, every layer), and tracing each one was most of a small state's save."""
    return jnp.stack([_leaf_digest_call(jnp.asarray(leaf)) for leaf in leaves])



def _digests(leaves: list) -> list[list[int]]:
    """[a, b] of each leaf: one `_tree_digest` call per set of devices the leaves live on (one for a state on one
    mesh; leaves committed to other devices cannot share a program), groups in order of first appearance so that
    every process dispatches the same global programs in the same order."""
    groups: dict = {}
    for position, leaf in enumerate(leaves):
        devices = frozenset(leaf.sharding.device_set) if isinstance(leaf, jax.Array) else None
        groups.setdefault(devices, []).append(position)
    dispatched = [(positions, _tree_digest(tuple(leaves[p] for p in positions))) for positions in groups.values()]
    out: list = [None] * len(leaves)
    for positions, digest in dispatched:   # a reduction's result is replicated: this process's copy is the whole
        for position, row in zip(positions, np.asarray(digest.addressable_data(0))):
            out[position] = [int(row[0]), int(row[1])]
    return out


def leaf_digests(tree) -> dict:
    """{"algorithm": DIGEST_ALGORITHM, "leaves": {leaf path: {"dtype": name, "digest": [a, b]}}} of every leaf of
    `tree`. Every process of a multi-process job must call it (the reduction spans their devices); it returns when
    the digests are on the host, so the arrays may be donated afterwards."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    digests = _digests([leaf for _, leaf in leaves])
    return {"algorithm": DIGEST_ALGORITHM,
            "leaves": {jax.tree_util.keystr(path): {"dtype": _dtype(leaf), "digest": digest}
                       for (path, leaf), digest in zip(leaves, digests)}}


def _dtype(leaf) -> str:
    return str(leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype)


def check_digests(tree, digests: dict) -> None:
    """Raises DigestMismatch (one line, naming the leaf) when a leaf of `tree` that `digests` (from `leaf_digests`
    at save, or a "crc32" checkpoint's) covers differs from what was saved, or `digests` is malformed. Leaves not
    saved, or restored in another dtype, are not compared."""
    try:
        algorithm, saved = digests["algorithm"], digests["leaves"]
        field = {DIGEST_ALGORITHM: "digest", CRC32_ALGORITHM: "shards"}.get(algorithm)
        if field is None or not isinstance(saved, dict):
            raise TypeError(f"algorithm {algorithm!r}")
        if not all(isinstance(leaf, dict) and {"dtype", field} <= leaf.keys() for leaf in saved.values()):
            raise TypeError(f"a leaf without its dtype and {field}")
    except (KeyError, TypeError) as err:
        raise DigestMismatch(f"its leaf digests are malformed ({err})") from None
    named = [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]
    compared = [(name, leaf) for name, leaf in named if name in saved and saved[name]["dtype"] == _dtype(leaf)]
    if algorithm == CRC32_ALGORITHM:
        mismatch = first_crc32_mismatch(compared, saved)
    else:
        mismatch = next((f"leaf {name} differs from what was saved ({DIGEST_ALGORITHM} {_hex(got)}, saved "
                         f"{_hex(saved[name]['digest'])})" for (name, _), got
                         in zip(compared, _digests([leaf for _, leaf in compared]))
                         if got != list(saved[name]["digest"])), None)
    if mismatch is not None:
        raise DigestMismatch(f"{mismatch}: damaged on disk")


def meta_digest(meta: dict) -> str:
    """SHA-256 (hex) of a step's JSON meta, as sorted JSON after a JSON round trip (so the meta as saved, with its
    tuples and any non-string keys, digests as the meta read back does)."""
    return hashlib.sha256(json.dumps(json.loads(json.dumps(meta)), sort_keys=True).encode()).hexdigest()


def check_meta(meta: dict, digests: dict) -> None:
    """Raises DigestMismatch when `meta` differs from the meta `digests` recorded (a step saved before meta digests
    existed records none: not checked)."""
    saved = digests.get("meta")
    if saved is None:
        return
    read = meta_digest(meta)
    if read != saved:
        raise DigestMismatch(f"its meta differs from what was saved (sha256 {read[:16]}, saved {str(saved)[:16]}): "
                             "damaged on disk")


def _hex(digest) -> str:
    return ":".join(f"{int(word):08x}" for word in digest)
