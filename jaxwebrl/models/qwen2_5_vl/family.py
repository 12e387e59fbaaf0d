"""Qwen2.5-VL registered as a model family (`jaxwebrl.models.families`)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.families import ModelFamily, register_family
from jaxwebrl.models.param_map import legacy_hf_name
from jaxwebrl.models.processor import ImageProcessorConfig
from jaxwebrl.models.qwen2_5_vl import hf_config, params, presets
from jaxwebrl.models.qwen2_5_vl.vision import Qwen25VisionModel


def vision_tower(config: ModelConfig, dtype: jnp.dtype, param_dtype: jnp.dtype) -> Qwen25VisionModel:
    """The tower (never scanned: `scan_layers` stacks the decoder only)."""
    return Qwen25VisionModel(config.vision, remat=config.remat, attention_chunk=config.attention_chunk,
                             attention_impl=config.attention_impl, dtype=dtype, param_dtype=param_dtype)


FAMILY = register_family(ModelFamily(
    model_type="qwen2_5_vl",
    architecture="Qwen2_5_VLForConditionalGeneration",
    text_section=hf_config.text_section,
    text_fields=hf_config.text_fields,
    vision_fields=hf_config.vision_fields,
    hf_text=hf_config.hf_text,
    hf_vision=hf_config.hf_vision,
    hf_top_level=hf_config.hf_top_level,
    vision_tower=vision_tower,
    param_specs=params.param_specs,
    image_processor=ImageProcessorConfig.qwen2_5_vl,
    hf_disk_name=legacy_hf_name,   # written with the legacy names transformers itself writes for this family
    presets=presets.PUBLISHED,
    vision_block_index_keys=("fullatt_block_indexes",),
    vision_mlp_matrices=3,         # SwiGLU
    vision_window_attention=True,
))
