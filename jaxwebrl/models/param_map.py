"""HF checkpoint names <-> Flax param paths: the row type, the text decoder's rows (shared by the families),
tensor transforms in both directions. A family's whole map is `config.family.param_specs(config)` (its
`params.py` adds the vision tower's rows to `text_decoder_specs`)."""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from jaxwebrl.models.config import ModelConfig


class ParamSpec(NamedTuple):
    """One HF tensor. `layer` is None for a Flax leaf of its own, or i when the leaf at `path` stacks every
    decoder layer (scan_layers: leaf [L, ...], this tensor is leaf[i])."""

    hf_name: str
    path: tuple[str, ...]
    kind: str  # "linear" | "conv" | "copy"
    layer: int | None = None


def linear(hf: str, path: tuple, *, bias: bool) -> list[ParamSpec]:
    specs = [ParamSpec(f"{hf}.weight", path + ("kernel",), "linear")]
    if bias:
        specs.append(ParamSpec(f"{hf}.bias", path + ("bias",), "copy"))
    return specs


def text_decoder_specs(config: ModelConfig) -> list[ParamSpec]:
    """Rows of the text decoder and head (HF: model.language_model.*, lm_head). With `config.scan_layers` the
    layer rows point into the stacked `language_model/layers/...` leaves (`ParamSpec.layer`)."""
    t = config.text
    hf, root = "model.language_model", ("language_model",)
    specs = [ParamSpec(f"{hf}.embed_tokens.weight", root + ("embed_tokens", "embedding"), "copy")]
    for i in range(t.num_layers):
        b = f"{hf}.layers.{i}"
        p = root + ("layers",) if config.scan_layers else root + (f"layers_{i}",)
        first = len(specs)
        specs.append(ParamSpec(f"{b}.input_layernorm.weight", p + ("input_layernorm", "weight"), "copy"))
        specs.append(
            ParamSpec(f"{b}.post_attention_layernorm.weight", p + ("post_attention_layernorm", "weight"), "copy")
        )
        for name in ("q_proj", "k_proj", "v_proj"):
            specs += linear(f"{b}.self_attn.{name}", p + ("self_attn", name), bias=t.attention_bias)
        specs += linear(f"{b}.self_attn.o_proj", p + ("self_attn", "o_proj"), bias=False)
        if t.qk_norm:
            specs.append(ParamSpec(f"{b}.self_attn.q_norm.weight", p + ("self_attn", "q_norm", "weight"), "copy"))
            specs.append(ParamSpec(f"{b}.self_attn.k_norm.weight", p + ("self_attn", "k_norm", "weight"), "copy"))
        for name in ("gate_proj", "up_proj", "down_proj"):
            specs += linear(f"{b}.mlp.{name}", p + ("mlp", name), bias=False)
        if config.scan_layers:
            specs[first:] = [spec._replace(layer=i) for spec in specs[first:]]
    specs.append(ParamSpec(f"{hf}.norm.weight", root + ("norm", "weight"), "copy"))
    if not config.tie_word_embeddings:
        specs.append(ParamSpec("lm_head.weight", ("lm_head", "weight"), "copy"))   # [V, E] both sides
    return specs


# Older checkpoints (e.g. published Qwen2.5-VL) name the text model `model.*` and the tower `visual.*`.
_LEGACY_PREFIXES = (
    (re.compile(r"^visual\."), "model.visual."),
    (re.compile(r"^model\.(?!language_model\.|visual\.)"), "model.language_model."),
)


def canonical_hf_name(name: str) -> str:
    """Checkpoint key in the current transformers layout (model.language_model.*, model.visual.*)."""
    for pattern, replacement in _LEGACY_PREFIXES:
        if pattern.match(name):
            return pattern.sub(replacement, name, count=1)
    return name


def legacy_hf_name(name: str) -> str:
    """The legacy key (`model.*` text, `visual.*` tower) that Qwen2.5-VL checkpoints use on disk."""
    if name.startswith("model.visual."):
        return name[len("model.") :]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    return name


def hf_to_flax(tensor: np.ndarray, kind: str) -> np.ndarray:
    if kind == "linear":
        return tensor.T
    if kind == "conv":
        return tensor.reshape(tensor.shape[0], -1).T
    return tensor


def flax_to_hf(array: np.ndarray, kind: str, hf_shape: tuple[int, ...] | None = None) -> np.ndarray:
    if kind == "linear":
        return array.T
    if kind == "conv":
        return array.T.reshape(hf_shape)
    return array


def conv_hf_shape(config: ModelConfig) -> tuple[int, ...]:
    v = config.vision
    return (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
