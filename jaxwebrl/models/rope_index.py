"""M-RoPE position ids for mixed text/image sequences (Qwen3-VL and Qwen2.5-VL images share the rule).

Text tokens advance all three axes (T, H, W) together by one. An image with merged grid (t, h, w) starting
at position p gets positions p + (ti, hi, wi) over its t*h*w tokens, and the text after it continues at
p + max(h, w). Padding (attention_mask == 0) is skipped and gets position 0. The computation is pure jnp
(no host loop), so it runs under jit; `image_grid_thw` rows are bound to image runs in batch-major order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def get_rope_index(
    input_ids: jax.Array,
    image_grid_thw: jax.Array | None,
    attention_mask: jax.Array | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
):
    """input_ids [B, T] int; image_grid_thw [N, 3] int (patch grid, before merging) or None;
    attention_mask [B, T] (1 = real token) or None.

    Returns (position_ids [3, B, T] int32, rope_deltas [B] int32) where rope_deltas = max position + 1 minus
    the number of real tokens, so the k-th later text token (0-based, counting real tokens) sits at
    k + rope_deltas.
    """
    input_ids = jnp.asarray(input_ids)
    b, t = input_ids.shape
    valid = jnp.ones((b, t), bool) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
    steps = jnp.arange(t, dtype=jnp.int32)
    if image_grid_thw is None or len(image_grid_thw) == 0:
        is_img = jnp.zeros((b, t), bool)
        grid = jnp.ones((b, t, 3), jnp.int32)
    else:
        grid_thw = jnp.asarray(image_grid_thw, jnp.int32)
        is_img = (input_ids == image_token_id) & valid
        prev = jnp.pad(is_img[:, :-1], ((0, 0), (1, 0)))
        run_start = is_img & ~prev
        image_index = jnp.cumsum(run_start.reshape(-1)).reshape(b, t) - 1
        image_index = jnp.clip(image_index, 0, grid_thw.shape[0] - 1)
        grid = grid_thw[image_index]  # [B, T, 3]
    merged_h = grid[..., 1] // spatial_merge_size
    merged_w = grid[..., 2] // spatial_merge_size
    nxt = jnp.pad(is_img[:, 1:], ((0, 0), (0, 1)))
    run_end = is_img & ~nxt
    prev = jnp.pad(is_img[:, :-1], ((0, 0), (1, 0)))
    run_start = is_img & ~prev
    start_step = jax.lax.cummax(jnp.where(run_start, steps[None, :], -1), axis=1)
    within = steps[None, :] - start_step  # offset inside the current image run
    ti = within // (merged_h * merged_w)
    hi = (within // merged_w) % merged_h
    wi = within % merged_w
    advance = (valid & ~is_img).astype(jnp.int32) + jnp.where(run_end, jnp.maximum(merged_h, merged_w), 0)
    start = jnp.cumsum(advance, axis=1) - advance  # position where the current token (or its image) begins
    offsets = jnp.stack([ti, hi, wi]) * is_img[None].astype(jnp.int32)
    position_ids = jnp.where(valid[None], start[None] + offsets, 0).astype(jnp.int32)
    last = jnp.max(jnp.where(valid[None], position_ids, -1), axis=(0, 2))
    rope_deltas = (last + 1 - valid.sum(axis=1)).astype(jnp.int32)
    return position_ids, rope_deltas
