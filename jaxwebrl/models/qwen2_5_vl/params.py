"""Explicit HF-name -> Flax param-path map for Qwen2.5-VL (kinds as in `qwen3_vl.params`).

Names are in the current transformers layout (model.language_model.*, model.visual.*); published
checkpoints and transformers' own saves use the legacy `model.*` / `visual.*` prefixes, which
`param_map.canonical_hf_name` / `legacy_hf_name` translate.
"""

from __future__ import annotations

from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.param_map import ParamSpec, linear, text_decoder_specs


def vision_specs(config: ModelConfig) -> list[ParamSpec]:
    v = config.vision
    hf, root = "model.visual", ("visual",)
    specs = [ParamSpec(f"{hf}.patch_embed.proj.weight", root + ("patch_embed", "kernel"), "conv")]
    for i in range(v.depth):
        b, p = f"{hf}.blocks.{i}", root + (f"blocks_{i}",)
        specs.append(ParamSpec(f"{b}.norm1.weight", p + ("norm1", "weight"), "copy"))
        specs.append(ParamSpec(f"{b}.norm2.weight", p + ("norm2", "weight"), "copy"))
        specs += linear(f"{b}.attn.qkv", p + ("attn", "qkv"), bias=True)
        specs += linear(f"{b}.attn.proj", p + ("attn", "proj"), bias=True)
        for name in ("gate_proj", "up_proj", "down_proj"):
            specs += linear(f"{b}.mlp.{name}", p + ("mlp", name), bias=True)
    specs.append(ParamSpec(f"{hf}.merger.ln_q.weight", root + ("merger", "ln_q", "weight"), "copy"))
    specs += linear(f"{hf}.merger.mlp.0", root + ("merger", "mlp_0"), bias=True)
    specs += linear(f"{hf}.merger.mlp.2", root + ("merger", "mlp_2"), bias=True)
    return specs


def param_specs(config: ModelConfig) -> list[ParamSpec]:
    """Every parameter of a Qwen2.5-VL policy, HF name and Flax path."""
    return text_decoder_specs(config) + vision_specs(config)
