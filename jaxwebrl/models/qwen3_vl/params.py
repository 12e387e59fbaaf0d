"""Explicit HF-name -> Flax param-path map for Qwen3-VL.

Each row is `ParamSpec(hf_name, path, kind)`; `kind` says how the HF tensor becomes the Flax leaf:
"linear" transposes a torch Linear weight [out, in] to a kernel [in, out]; "conv" flattens the patch-embedding
Conv3d weight [D, C, T, P, P] to [D, C*T*P*P] and transposes it (the convolution is a linear map over the
flattened patch); "copy" keeps the tensor as is (embeddings, norms, biases).
"""

from __future__ import annotations

from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.param_map import ParamSpec, linear, text_decoder_specs
from jaxwebrl.models.qwen3_vl.vision import block_segments, segment_name


def _layer_norm(hf: str, path: tuple) -> list[ParamSpec]:
    return [ParamSpec(f"{hf}.weight", path + ("scale",), "copy"), ParamSpec(f"{hf}.bias", path + ("bias",), "copy")]


def _merger(hf: str, path: tuple) -> list[ParamSpec]:
    return (
        _layer_norm(f"{hf}.norm", path + ("norm",))
        + linear(f"{hf}.linear_fc1", path + ("linear_fc1",), bias=True)
        + linear(f"{hf}.linear_fc2", path + ("linear_fc2",), bias=True)
    )


def vision_specs(config: ModelConfig) -> list[ParamSpec]:
    v = config.vision
    hf, root = "model.visual", ("visual",)
    specs = [
        ParamSpec(f"{hf}.patch_embed.proj.weight", root + ("patch_embed", "kernel"), "conv"),
        ParamSpec(f"{hf}.patch_embed.proj.bias", root + ("patch_embed", "bias"), "copy"),
        ParamSpec(f"{hf}.pos_embed.weight", root + ("pos_embed",), "copy"),
    ]
    segment_of = {i: (a, b) for a, b in block_segments(v) for i in range(a, b)}
    for i in range(v.depth):
        b = f"{hf}.blocks.{i}"
        if config.scan_layers:   # block i is row i - start of its run's stacked leaves
            start, stop = segment_of[i]
            p = root + (segment_name(start, stop),)
        else:
            p = root + (f"blocks_{i}",)
        first = len(specs)
        specs += _layer_norm(f"{b}.norm1", p + ("norm1",)) + _layer_norm(f"{b}.norm2", p + ("norm2",))
        specs += linear(f"{b}.attn.qkv", p + ("attn", "qkv"), bias=True)
        specs += linear(f"{b}.attn.proj", p + ("attn", "proj"), bias=True)
        specs += linear(f"{b}.mlp.linear_fc1", p + ("mlp", "linear_fc1"), bias=True)
        specs += linear(f"{b}.mlp.linear_fc2", p + ("mlp", "linear_fc2"), bias=True)
        if config.scan_layers:
            specs[first:] = [spec._replace(layer=i - segment_of[i][0]) for spec in specs[first:]]
    specs += _merger(f"{hf}.merger", root + ("merger",))
    for j in range(len(v.deepstack_visual_indexes)):
        specs += _merger(f"{hf}.deepstack_merger_list.{j}", root + (f"deepstack_merger_list_{j}",))
    return specs


def param_specs(config: ModelConfig) -> list[ParamSpec]:
    """Every parameter of a Qwen3-VL policy, HF name and Flax path."""
    return text_decoder_specs(config) + vision_specs(config)
