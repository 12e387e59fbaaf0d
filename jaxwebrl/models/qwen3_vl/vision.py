"""Qwen3-VL vision tower: linear patch embedding, interpolated learned positions, 2-D rotary blocks,
a spatial patch merger, and DeepStack mergers on intermediate blocks."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jaxwebrl.models import vision_layout
from jaxwebrl.models.config import VisionConfig
from jaxwebrl.models.layers import dense, layer_norm
from jaxwebrl.models.vision_blocks import PatchMerger, VisionAttention, activation, block_class, vision_rotary
from jaxwebrl.parallel.mesh import constrain_batch


class VisionMLP(nn.Module):
    hidden: int
    intermediate: int
    act: str
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        kw = dict(use_bias=True, dtype=self.dtype, param_dtype=self.param_dtype)
        h = activation(self.act)(checkpoint_name(dense(self.intermediate, name="linear_fc1", **kw)(x), "mlpwi"))
        return checkpoint_name(dense(self.hidden, name="linear_fc2", **kw)(h), "mlpwo")


def block_segments(config: VisionConfig) -> list[tuple[int, int]]:
    """[(start, stop), ...]: runs of blocks that end at a DeepStack tap (or at the last block). The scanned tower
    stacks each run's params under `blocks_{start}_to_{stop - 1}` ([stop - start, ...] leaves)."""
    cuts = sorted({i + 1 for i in config.deepstack_visual_indexes} | {config.depth})
    starts = [0] + cuts[:-1]
    return [(a, b) for a, b in zip(starts, cuts) if b > a]


def segment_name(start: int, stop: int) -> str:
    return f"blocks_{start}_to_{stop - 1}"


class VisionBlock(nn.Module):
    """One pre-norm ViT block. `scanned`: returns (x, None), the carry/output pair of `nn.scan`."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    attention_chunk: int = 0
    attention_impl: str = "auto"
    scanned: bool = False

    @nn.compact
    def __call__(self, x, cos, sin, layout):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x = constrain_batch(x)          # patches [N, hidden] stay split over the batch axes (`parallel.mesh`)
        x = x + VisionAttention(c.hidden_size, c.num_heads, name="attn", attention_chunk=self.attention_chunk,
                                attention_impl=self.attention_impl, **kw)(
            layer_norm("norm1", **kw)(x), cos, sin, layout
        )
        x = x + VisionMLP(c.hidden_size, c.intermediate_size, c.hidden_act, name="mlp", **kw)(
            layer_norm("norm2", **kw)(x)
        )
        return (x, None) if self.scanned else x


class Qwen3VisionModel(nn.Module):
    """`remat`: rematerialisation policy of every block; `attention_chunk`: queries per attention chunk (0: dense);
    `attention_impl`: the attention kernel (`models/attention_kernels.py`);
    `scan_blocks`: each run of blocks up to a DeepStack tap is one `nn.scan` over stacked params (compile time
    independent of depth; `block_segments`)."""

    config: VisionConfig
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    remat: str = "none"
    attention_chunk: int = 0
    attention_impl: str = "auto"
    scan_blocks: bool = False

    @nn.compact
    def __call__(self, pixel_values: jax.Array, image_grid_thw):
        """pixel_values [N, C*T*P*P] (HF layout); image_grid_thw [num_images, 3] concrete.

        Returns (image_embeds [N / merge^2, out_hidden], deepstack: list of [N / merge^2, out_hidden]).
        """
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        grid = vision_layout.checked_grid(pixel_values, image_grid_thw, c.patch_dim)
        x = dense(c.hidden_size, use_bias=True, name="patch_embed", **kw)(pixel_values.astype(self.dtype))
        taps, weights = vision_layout.position_embedding_taps(grid, c.spatial_merge_size, c.num_position_embeddings)
        table = self.param(
            "pos_embed", nn.initializers.normal(0.02), (c.num_position_embeddings, c.hidden_size), self.param_dtype
        )
        pos = (table.astype(jnp.float32)[jnp.asarray(taps)] * jnp.asarray(weights)[..., None]).sum(1)
        x = x + pos.astype(x.dtype)
        cos, sin = vision_rotary(vision_layout.patch_positions(grid, c.spatial_merge_size), c.head_dim, c.rope_theta)
        layout = vision_layout.segment_layout(vision_layout.frame_lengths(grid))
        deepstack = []
        block = block_class(VisionBlock, self.remat, scanned=self.scan_blocks)
        if self.scan_blocks:
            for start, stop in block_segments(c):
                run = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                              in_axes=(nn.broadcast,) * 3, length=stop - start)
                x, _ = run(c, name=segment_name(start, stop), attention_chunk=self.attention_chunk,
                           attention_impl=self.attention_impl, scanned=True,
                           **kw)(x, cos, sin, layout)
                if stop - 1 in c.deepstack_visual_indexes:
                    j = c.deepstack_visual_indexes.index(stop - 1)
                    deepstack.append(PatchMerger(c, postshuffle_norm=True, name=f"deepstack_merger_list_{j}", **kw)(x))
            return PatchMerger(c, name="merger", **kw)(x), deepstack
        for i in range(c.depth):
            x = block(c, name=f"blocks_{i}", attention_chunk=self.attention_chunk,
                      attention_impl=self.attention_impl, **kw)(x, cos, sin, layout)
            if i in c.deepstack_visual_indexes:
                j = c.deepstack_visual_indexes.index(i)
                deepstack.append(PatchMerger(c, postshuffle_norm=True, name=f"deepstack_merger_list_{j}", **kw)(x))
        return PatchMerger(c, name="merger", **kw)(x), deepstack
