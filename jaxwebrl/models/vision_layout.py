"""Host-side (NumPy) index tables the vision towers need, computed from a concrete `image_grid_thw`.

Patches arrive in the HF processor's order: per image, per frame, spatial-merge blocks in raster order and
the merge x merge patches inside each block in raster order. Everything here depends on the grid values,
so the grid must be a concrete host array (under jit, pass it as a static argument).
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.parallel.buckets import bucket


def concrete_grid(image_grid_thw) -> np.ndarray:
    """[N, 3] int64 NumPy grid; a clear error when it is a tracer."""
    try:
        grid = np.asarray(image_grid_thw, dtype=np.int64)
    except Exception as err:  # jax raises a TracerArrayConversionError subclass of TypeError
        raise TypeError(
            "image_grid_thw must be a concrete host array (NumPy / nested tuples): the vision tower's "
            "attention segments and position tables depend on its values. Under jax.jit, pass it as a "
            "static argument (e.g. a tuple of (t, h, w) tuples)."
        ) from err
    if grid.ndim != 2 or grid.shape[1] != 3:
        raise ValueError(f"image_grid_thw must have shape [num_images, 3], got {grid.shape}")
    return grid


def bucketed_image_order(order: np.ndarray) -> np.ndarray:
    """`order` [N] (the images of a batch, in prompt order) followed by copies of its last entry up to `bucket(N)`
    images. Image features are bound to image tokens in batch order, so trailing extra images feed no token and
    change no output; what they buy is a static image grid that a varying image count (padding rows, prompts with
    fewer screenshots) no longer changes, so the compiled programs are reused instead of retraced."""
    order = np.asarray(order, np.int64).reshape(-1)
    if order.size == 0:
        return order
    target = bucket(order.size)
    return np.concatenate([order, np.full(target - order.size, order[-1], np.int64)])


def checked_grid(pixel_values, image_grid_thw, patch_dim: int) -> np.ndarray:
    """The concrete grid, after checking pixel_values is [sum of t*h*w, patch_dim]."""
    grid = concrete_grid(image_grid_thw)
    expected = int(grid.prod(-1).sum())
    if tuple(pixel_values.shape) != (expected, patch_dim):
        raise ValueError(
            f"pixel_values has shape {tuple(pixel_values.shape)} but image_grid_thw implies "
            f"[{expected}, {patch_dim}] (sum of t*h*w patches, C*T*P*P values each)"
        )
    return grid


def patch_positions(grid: np.ndarray, merge: int) -> np.ndarray:
    """[N, 2] int32 (row, col) of every patch, in merge-block order, repeated for each frame."""
    out = []
    for t, h, w in grid.tolist():
        rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
        out.append(np.tile(np.stack([rows, cols], -1), (t, 1)))
    return np.concatenate(out, 0).astype(np.int32)


def _axis_taps(index: np.ndarray, size: np.ndarray, side: int):
    """Bilinear (align_corners=True) taps into a `side`-long table; fp32 arithmetic like the reference."""
    index = index.astype(np.float32)
    denom = np.maximum(size - 1, 1).astype(np.float32)
    src = index * np.float32(side - 1) / denom
    floor = np.floor(src)
    offsets = np.arange(2)
    taps = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
    dist = np.abs(src[:, None] - floor[:, None] - offsets.astype(np.float32))
    return taps, np.maximum(np.float32(1) - dist, np.float32(0)).astype(np.float32)


def position_embedding_taps(grid: np.ndarray, merge: int, num_position_embeddings: int):
    """Bilinear resampling of the square learned position table to each image grid.

    Returns (indices [N, 4] int32 into the flattened table, weights [N, 4] float32).
    """
    side = int(num_position_embeddings**0.5)
    pos = patch_positions(grid, merge)
    sizes = np.concatenate([np.full((t * h * w, 2), (h, w)) for t, h, w in grid.tolist()], 0)
    h_taps, h_w = _axis_taps(pos[:, 0], sizes[:, 0], side)
    w_taps, w_w = _axis_taps(pos[:, 1], sizes[:, 1], side)
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
    weights = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
    return indices.astype(np.int32), weights.astype(np.float32)


def segment_layout(lengths) -> dict:
    """Pack consecutive segments of the given lengths into a padded [S, L] layout for batched attention.

    Returns gather [S, L] int32 (row index, 0 where padded), valid [S, L] bool, scatter [N] int32 (flat
    position of every row inside the [S * L] padded layout).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths = lengths[lengths > 0]
    width = int(lengths.max())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    cols = np.arange(width)
    valid = cols[None, :] < lengths[:, None]
    gather = np.where(valid, starts[:, None] + cols[None, :], 0)
    scatter = np.concatenate([s * width + np.arange(n) for s, n in enumerate(lengths)])
    return {"gather": gather.astype(np.int32), "valid": valid, "scatter": scatter.astype(np.int32)}


def frame_lengths(grid: np.ndarray) -> np.ndarray:
    """Attention segment lengths: every frame of every image attends within itself (h * w patches)."""
    return np.concatenate([np.full(t, h * w) for t, h, w in grid.tolist()])


def window_index(grid: np.ndarray, merge: int, window_size: int, patch_size: int):
    """Qwen2.5-VL window attention: permutation of merged tokens into windows, and window lengths in patches.

    Returns (index [N / merge^2] int32: merged token order grouped by window, lengths [W] int patches).
    """
    window = window_size // merge // patch_size
    unit = merge * merge
    order, lengths, base = [], [], 0
    for t, h, w in grid.tolist():
        gh, gw = h // merge, w // merge
        idx = np.arange(t * gh * gw).reshape(t, gh, gw)
        pad_h, pad_w = window - gh % window, window - gw % window
        nh, nw = (gh + pad_h) // window, (gw + pad_w) // window
        padded = np.pad(idx, ((0, 0), (0, pad_h), (0, pad_w)), constant_values=-1)
        padded = padded.reshape(t, nh, window, nw, window).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, -1)
        counts = (padded >= 0).sum(-1).reshape(-1)
        flat = padded.reshape(-1)
        order.append(flat[flat >= 0] + base)
        lengths.append(counts * unit)
        base += t * gh * gw
    return np.concatenate(order).astype(np.int32), np.concatenate(lengths)
