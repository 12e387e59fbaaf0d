"""Qwen3-VL registered as a model family (`jaxwebrl.models.families`)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.families import ModelFamily, register_family
from jaxwebrl.models.processor import ImageProcessorConfig
from jaxwebrl.models.qwen3_vl import hf_config, params, presets
from jaxwebrl.models.qwen3_vl.vision import Qwen3VisionModel, block_segments, segment_name


def vision_tower(config: ModelConfig, dtype: jnp.dtype, param_dtype: jnp.dtype) -> Qwen3VisionModel:
    """The tower; with `scan_layers` each run of blocks up to a DeepStack tap is one scan."""
    return Qwen3VisionModel(config.vision, remat=config.remat, attention_chunk=config.attention_chunk,
                            attention_impl=config.attention_impl,
                            scan_blocks=config.scan_layers, dtype=dtype, param_dtype=param_dtype)


def vision_stacks(config: ModelConfig) -> list[tuple[str, int, int]]:
    """(stacked name, first block, count) of every scanned run of blocks."""
    return [(segment_name(a, b), a, b - a) for a, b in block_segments(config.vision)]


FAMILY = register_family(ModelFamily(
    model_type="qwen3_vl",
    architecture="Qwen3VLForConditionalGeneration",
    text_fields=hf_config.text_fields,
    vision_fields=hf_config.vision_fields,
    hf_text=hf_config.hf_text,
    hf_vision=hf_config.hf_vision,
    vision_tower=vision_tower,
    param_specs=params.param_specs,
    image_processor=ImageProcessorConfig.qwen3_vl,
    vision_stacks=vision_stacks,
    presets=presets.PUBLISHED,
    vision_block_index_keys=("deepstack_visual_indexes",),
    vision_mlp_matrices=2,
))
