"""Group bookkeeping for variable-size groups under `jit`.

Rows carry arbitrary integer ids (episode ids, group ids). Group reductions need a dense index in
`[0, num_segments)` with a *static* `num_segments`; `dense_ids` ranks the ids with
`jnp.unique(..., size=num_segments)`. The default `num_segments` is the number of rows, which is always
large enough (there cannot be more distinct ids than rows) and is static because it is a shape.
Pass a smaller `num_segments` only to save work, and only when you know the number of distinct ids.

Ids reach jit as JAX's default int (int32 unless x64 is on): two 64-bit ids equal in their low 32 bits would merge.
So every public entry ranks concrete ids on the host first (`host_dense_ids`, NumPy, any width) and only the dense
int32 ranks enter jit; ids traced inside a caller's jit must already be int32-safe.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(*arrays) -> bool:
    """True when no argument is a JAX tracer (eager call): value checks can run in Python."""
    return not any(isinstance(a, jax.core.Tracer) for a in arrays)


def as_arrays(*xs):
    """Python lists/tuples -> NumPy arrays (so jit sees one array, not a pytree of scalars); others unchanged."""
    out = tuple(np.asarray(x) if isinstance(x, (list, tuple)) else x for x in xs)
    return out if len(out) != 1 else out[0]


def host_dense_ids(ids):
    """Concrete ids of any integer width (NumPy int64 episode/group ids) -> [N] int32 ranks in sorted-id order,
    computed in NumPy so no id is truncated; traced ids are returned unchanged (already inside a jit)."""
    if not is_concrete(ids):
        return ids
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D [N], got shape {ids.shape}; flatten rows first")
    return np.unique(ids, return_inverse=True)[1].reshape(-1).astype(np.int32)


def check_num_segments(ids, num_segments: int) -> None:
    """Eager check (NumPy) that `num_segments` bounds the number of distinct `ids`."""
    distinct = len(np.unique(np.asarray(ids)))
    if distinct > num_segments:
        raise ValueError(
            f"num_segments={num_segments} is smaller than the {distinct} distinct ids; "
            "pass num_segments=None (rows count) or a larger static bound")


def dense_ids(ids, num_segments: int | None = None):
    """Rank arbitrary ids into a dense index.

    Args:
      ids: [N] integer ids (any values, any order; equal ids form one segment).
      num_segments: static upper bound on the number of distinct ids; default N.

    Returns:
      (index [N] int32 in [0, num_segments), num_segments). Index order follows sorted id order.
    """
    ids = jnp.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D [N], got shape {ids.shape}; flatten rows first")
    n = ids.shape[0]
    size = n if num_segments is None else int(num_segments)
    if size < 1:
        size = 1
    if num_segments is not None and is_concrete(ids):
        check_num_segments(ids, size)
    if n == 0:
        return jnp.zeros((0,), jnp.int32), size
    _, index = jnp.unique(ids, return_inverse=True, size=size, fill_value=ids.min())
    return index.reshape(n).astype(jnp.int32), size


def segment_sum(data, index, num_segments: int):
    """Sum of `data` [N, ...] over rows with equal `index` [N]: returns [num_segments, ...]."""
    return jax.ops.segment_sum(data, index, num_segments=num_segments)


def segment_max(data, index, num_segments: int):
    """Max over segments; empty segments give the dtype's lowest value."""
    return jax.ops.segment_max(data, index, num_segments=num_segments)


def segment_min(data, index, num_segments: int):
    """Min over segments; empty segments give the dtype's highest value."""
    return jax.ops.segment_min(data, index, num_segments=num_segments)


def row_reduce(x, mask):
    """Per-row sums of `x * mask` and of `mask` over trailing axes: ([N], [N]) float32."""
    x = jnp.asarray(x, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    axes = tuple(range(1, x.ndim))
    return (x * mask).sum(axis=axes), mask.sum(axis=axes)


def broadcast_rows(per_row, like):
    """Broadcast a per-row value [N] to the shape of `like` [N, ...]."""
    per_row = jnp.asarray(per_row)
    return jnp.broadcast_to(per_row.reshape(per_row.shape + (1,) * (like.ndim - 1)), like.shape)
