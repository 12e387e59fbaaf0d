"""Published model shapes (random weights, nothing downloaded) and the one place a run config becomes a model.

`PUBLISHED` holds the `config.json` values of Qwen3-VL-2B-Instruct, Qwen3-VL-8B-Instruct and Qwen2.5-VL-7B-Instruct
as released; `preset_config(name)` turns one into a `ModelConfig` (optionally with fewer decoder layers / vision
blocks for rehearsals; DeepStack taps and full-attention blocks are scaled to the reduced depth).

`model_config(config.model)` / `build_policy(config.model, seed)` read a run config's model section:

  model.name = "tiny"        the tiny random policy (CPU default)
  model.name = "pretrained"  a local HF checkpoint (model.checkpoint)
  model.name = "random"      random weights at model.preset's published shapes, with the real Qwen vocabulary

and apply the precision and memory knobs (`model.dtype` compute, `model.param_dtype` storage, `model.remat`,
`model.scan_layers`, `model.attention_chunk`, `model.logits_chunk`, `model.num_layers`, `model.vision_depth`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping

from jaxwebrl.models.config import ModelConfig, from_hf_dict, tiny_config

_QWEN3_VL_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                     vision_end_token_id=151653)

PUBLISHED: dict[str, dict[str, Any]] = {
    "qwen3vl_2b": dict(
        model_type="qwen3_vl", tie_word_embeddings=True, **_QWEN3_VL_IDS,
        text_config=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=262144, attention_bias=False, tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="default", mrope_section=[24, 20, 20], mrope_interleaved=True),
                         rope_theta=5000000),
        vision_config=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                           patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                           num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
                           hidden_act="gelu_pytorch_tanh"),
    ),
    "qwen3vl_8b": dict(
        model_type="qwen3_vl", tie_word_embeddings=False, **_QWEN3_VL_IDS,
        text_config=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=262144, attention_bias=False,
                         rope_scaling=dict(rope_type="default", mrope_section=[24, 20, 20], mrope_interleaved=True),
                         rope_theta=5000000),
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                           patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                           num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                           hidden_act="gelu_pytorch_tanh"),
    ),
    "qwen2_5vl_7b": dict(
        model_type="qwen2_5_vl", tie_word_embeddings=False, **_QWEN3_VL_IDS,
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=128000, rope_theta=1000000.0,
        use_sliding_window=False, rope_scaling=dict(type="mrope", mrope_section=[16, 24, 24]),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2, in_chans=3, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu"),
    ),
}

KNOBS = ("remat", "scan_layers", "attention_chunk", "logits_chunk", "attention_impl")


def _scaled(indexes, depth: int, new_depth: int) -> list[int]:
    """Block indexes of a `depth`-block tower mapped onto `new_depth` blocks (order kept, duplicates dropped)."""
    out: list[int] = []
    for i in indexes:
        j = min(new_depth - 1, (i * new_depth) // depth)
        if j not in out:
            out.append(j)
    return out


def preset_config(name: str, *, dtype: str = "float32", param_dtype: str | None = None, num_layers: int | None = None,
                  vision_depth: int | None = None) -> ModelConfig:
    """The published shapes of preset `name` (see PUBLISHED), optionally with fewer layers / vision blocks."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown model preset {name!r}: use one of {', '.join(PUBLISHED)}")
    hf = copy.deepcopy(PUBLISHED[name])
    text = hf["text_config"] if "text_config" in hf else hf
    vision = hf["vision_config"]
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"model.num_layers={num_layers} must be >= 1")
        text["num_hidden_layers"] = num_layers
    if vision_depth is not None:
        if vision_depth < 1:
            raise ValueError(f"model.vision_depth={vision_depth} must be >= 1")
        for key in ("deepstack_visual_indexes", "fullatt_block_indexes"):
            if key in vision:
                vision[key] = _scaled(vision[key], vision["depth"], vision_depth)
        vision["depth"] = vision_depth
    return from_hf_dict(hf, dtype=dtype, param_dtype=param_dtype)


def _get(section: Mapping[str, Any] | Any, key: str, default=None):
    getter = getattr(section, "get", None)
    return getter(key, default) if getter is not None else default


def knobs(section) -> dict:
    """The ModelConfig knobs a run config's model section sets."""
    out = {}
    for key in KNOBS:
        value = _get(section, key)
        if value is not None:
            out[key] = value
    return out


def model_config(section) -> ModelConfig:
    """The ModelConfig a run config's `model` section names (see the module docstring); nothing is loaded."""
    name = _get(section, "name", "tiny")
    dtype = _get(section, "dtype", "float32")
    param_dtype = _get(section, "param_dtype") or dtype
    if name == "tiny":
        config = tiny_config()
        config = config.replace(dtype=dtype, param_dtype=param_dtype)
    elif name == "pretrained" or (name != "random" and _get(section, "checkpoint")):
        from jaxwebrl.models.hf_io import read_config

        checkpoint = _get(section, "checkpoint")
        if not checkpoint:
            raise ValueError("model.name='pretrained' needs --config.model.checkpoint=HF_DIR")
        config = read_config(checkpoint, dtype, param_dtype)
    elif name == "random":
        preset = _get(section, "preset")
        if not preset:
            raise ValueError(f"model.name='random' needs model.preset (one of {', '.join(PUBLISHED)})")
        config = preset_config(preset, dtype=dtype, param_dtype=param_dtype, num_layers=_get(section, "num_layers"),
                               vision_depth=_get(section, "vision_depth"))
    else:
        raise ValueError(f"model.name={name!r}: use 'tiny', 'pretrained' or 'random'")
    return config.replace(**knobs(section))


def shapes_config(section) -> ModelConfig:
    """Like `model_config`, but a 'pretrained' section without a checkpoint falls back to `model.preset`'s
    published shapes (launch/compile.py costs a recipe before any checkpoint exists)."""
    if _get(section, "name") == "pretrained" and not _get(section, "checkpoint") and _get(section, "preset"):
        view = {key: _get(section, key) for key in ("dtype", "param_dtype", "preset", "num_layers", "vision_depth",
                                                     *KNOBS)}
        return model_config({**view, "name": "random"})
    return model_config(section)


def image_processor_for(config: ModelConfig):
    """The family's released image-processor settings at the model's patch and merge sizes."""
    from jaxwebrl.models.processor import ImageProcessor, ImageProcessorConfig

    image = ImageProcessorConfig.qwen3_vl() if config.model_type == "qwen3_vl" else ImageProcessorConfig.qwen2_5_vl()
    image = dataclasses.replace(image, patch_size=config.vision.patch_size, merge_size=config.vision.spatial_merge_size,
                                temporal_patch_size=config.vision.temporal_patch_size)
    return ImageProcessor(image)


def processor_for(config: ModelConfig):
    """The processor of a random-weights preset: the real Qwen vocabulary + the family's image processor."""
    from jaxwebrl.models.processor import Processor
    from jaxwebrl.models.qwen_vocab import qwen_tokenizer

    return Processor(qwen_tokenizer(), image_processor_for(config))


def build_policy(section, seed: int = 0, *, with_params: bool = True):
    """The Policy a run config's `model` section names, knobs applied. `with_params=False`: params are
    ShapeDtypeStructs (nothing allocated or read)."""
    from jaxwebrl.models.policy import Policy, init_params, init_params_shapes
    from jaxwebrl.models.vl_model import VisionLanguageModel

    name = _get(section, "name", "tiny")
    config = model_config(section)
    if name == "pretrained":
        from jaxwebrl.models.hf_io import _load_processor, load_pretrained

        checkpoint = _get(section, "checkpoint")
        if with_params:
            return load_pretrained(checkpoint, dtype=config.dtype, param_dtype=config.param_dtype,
                                   model_options=knobs(section))
        return Policy(config, VisionLanguageModel(config), init_params_shapes(config), _load_processor(checkpoint))
    if name == "tiny":
        from jaxwebrl.models.processor import tiny_processor

        processor = tiny_processor()
    else:
        processor = processor_for(config)
    if not with_params:
        return Policy(config, VisionLanguageModel(config), init_params_shapes(config), processor)
    module, params = init_params(config, seed)
    return Policy(config, module, params, processor)
