"""Qwen3-VL's part of the config.json translation (`models.config.from_hf_dict` / `to_hf_dict` do the shared rest).

Interleaved M-RoPE, per-head q/k RMSNorm, an explicit `head_dim`; the tower has learned, interpolated position
embeddings and DeepStack mergers on the blocks `deepstack_visual_indexes` names.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxwebrl.models.config import ModelConfig


def text_fields(text: Mapping[str, Any]) -> dict:
    """TextConfig fields of a Qwen3-VL `text_config`."""
    return dict(mrope_interleaved=True, qk_norm=True, attention_bias=text.get("attention_bias", False))


def vision_fields(vision: Mapping[str, Any]) -> dict:
    """VisionConfig fields of a Qwen3-VL `vision_config` (no windows)."""
    return dict(hidden_act=vision.get("hidden_act", "gelu_pytorch_tanh"),
                num_position_embeddings=vision.get("num_position_embeddings", 0),
                deepstack_visual_indexes=tuple(vision.get("deepstack_visual_indexes", ())))


def hf_text(config: ModelConfig) -> dict:
    return dict(attention_bias=config.text.attention_bias, head_dim=config.text.head_dim)


def hf_vision(config: ModelConfig) -> dict:
    v = config.vision
    return dict(num_position_embeddings=v.num_position_embeddings,
                deepstack_visual_indexes=list(v.deepstack_visual_indexes),
                rope_parameters={"rope_type": "axial", "rope_theta": v.rope_theta})
