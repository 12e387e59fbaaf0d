"""Qwen2.5-VL's part of the config.json translation (`models.config.from_hf_dict` / `to_hf_dict` do the shared rest).

Contiguous M-RoPE chunks, biased q/k/v, no q/k norm, head_dim = hidden_size / heads; the tower attends within
windows except in `fullatt_block_indexes`. Published checkpoints keep the text fields at config.json's top level
(a `text_config` copy may sit beside them).
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxwebrl.models.config import ModelConfig


def text_section(hf: Mapping[str, Any]) -> dict:
    """The text fields: config.json's top level, overridden by its `text_config` when there is one."""
    top = {k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}
    return {**top, **(hf.get("text_config") or {})}


def text_fields(text: Mapping[str, Any]) -> dict:
    return dict(mrope_interleaved=False, qk_norm=False, attention_bias=True)


def vision_fields(vision: Mapping[str, Any]) -> dict:
    """VisionConfig fields of a Qwen2.5-VL `vision_config` (no learned positions, no DeepStack)."""
    return dict(hidden_act=vision.get("hidden_act", "silu"), window_size=vision.get("window_size", 112),
                fullatt_block_indexes=tuple(vision.get("fullatt_block_indexes", ())))


def hf_text(config: ModelConfig) -> dict:
    t = config.text
    if t.head_dim * t.num_heads != t.hidden_size:
        raise ValueError("Qwen2.5-VL requires head_dim * num_heads == hidden_size")
    return {}


def hf_vision(config: ModelConfig) -> dict:
    v = config.vision
    return dict(window_size=v.window_size, fullatt_block_indexes=list(v.fullatt_block_indexes),
                tokens_per_second=v.tokens_per_second)


def hf_top_level(out: dict, text: dict) -> dict:
    """Qwen2.5-VL keeps a copy of the text fields at the top level: refresh the ones there, drop the old rope keys."""
    out = {k: (text[k] if k in text and k != "model_type" else v) for k, v in out.items()}
    out.pop("rope_scaling", None)
    out.pop("rope_theta", None)
    return out
