"""Qwen2.5-VL vision tower: linear patch embedding (no bias), RMSNorm/SwiGLU blocks with 2-D rotary,
window attention except in `fullatt_block_indexes`, and an RMSNorm patch merger.

Tokens are processed in window order (merged blocks grouped by window) and put back in the processor's order
after the merger, as in the reference.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.models import vision_layout
from jaxwebrl.models.config import VisionConfig
from jaxwebrl.models.layers import RMSNorm, SwiGLU, dense
from jaxwebrl.models.vision_blocks import PatchMerger, VisionAttention, block_class, vision_rotary


class VisionBlock(nn.Module):
    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_chunk: int = 0
    attention_impl: str = "auto"

    @nn.compact
    def __call__(self, x, cos, sin, layout):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x = x + VisionAttention(c.hidden_size, c.num_heads, name="attn", attention_chunk=self.attention_chunk,
                                attention_impl=self.attention_impl, **kw)(
            RMSNorm(c.hidden_size, 1e-6, name="norm1", **kw)(x), cos, sin, layout
        )
        mlp = SwiGLU(c.hidden_size, c.intermediate_size, use_bias=True, name="mlp", **kw)
        return x + mlp(RMSNorm(c.hidden_size, 1e-6, name="norm2", **kw)(x))


class Qwen25VisionModel(nn.Module):
    """`remat`: rematerialisation policy of every block; `attention_chunk`: queries per attention chunk (0: dense);
    `attention_impl`: the attention kernel (`models/attention_kernels.py`)."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    remat: str = "none"
    attention_chunk: int = 0
    attention_impl: str = "auto"

    @nn.compact
    def __call__(self, pixel_values: jax.Array, image_grid_thw):
        """pixel_values [N, C*T*P*P]; image_grid_thw [num_images, 3] concrete.

        Returns (image_embeds [N / merge^2, out_hidden], [] — Qwen2.5-VL has no DeepStack).
        """
        c = self.config
        if c.hidden_act != "silu":
            raise ValueError(f"Qwen2.5-VL vision hidden_act {c.hidden_act!r} is not supported (silu only)")
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        grid = vision_layout.checked_grid(pixel_values, image_grid_thw, c.patch_dim)
        unit = c.spatial_merge_size**2
        merged_order, window_lengths = vision_layout.window_index(grid, c.spatial_merge_size, c.window_size, c.patch_size)
        patch_order = (merged_order[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
        x = dense(c.hidden_size, use_bias=False, name="patch_embed", **kw)(pixel_values.astype(self.dtype))
        x = x[jnp.asarray(patch_order)]
        positions = vision_layout.patch_positions(grid, c.spatial_merge_size)[patch_order]
        cos, sin = vision_rotary(positions, c.head_dim, c.rope_theta)
        full = vision_layout.segment_layout(vision_layout.frame_lengths(grid))
        windows = vision_layout.segment_layout(window_lengths)
        block = block_class(VisionBlock, self.remat)
        for i in range(c.depth):
            layout = full if i in c.fullatt_block_indexes else windows
            x = block(c, name=f"blocks_{i}", attention_chunk=self.attention_chunk,
                      attention_impl=self.attention_impl, **kw)(x, cos, sin, layout)
        merged = PatchMerger(c, norm="rms", names=("ln_q", "mlp_0", "mlp_2"), name="merger", **kw)(x)
        return merged[jnp.asarray(np.argsort(merged_order))], []
