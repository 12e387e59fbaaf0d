"""Published model shapes (random weights, nothing downloaded) and the one place a run config becomes a model.

`PUBLISHED` holds the `config.json` values of Qwen3-VL-2B-Instruct, Qwen3-VL-8B-Instruct and Qwen2.5-VL-7B-Instruct
as released (each family's `presets.py`, gathered by `families.published_presets`); `preset_config(name)` turns
one into a `ModelConfig` (optionally with fewer decoder layers / vision blocks for rehearsals; the block indexes a
family lists, DeepStack taps and full-attention blocks, are scaled to the reduced depth).

`model_config(config.model)` / `build_policy(config.model, seed)` read a run config's model section:

  model.name = "tiny"        the tiny random policy (CPU default)
  model.name = "tiny_hd32"   the tiny policy at head_dim 32 (vLLM's CPU attention refuses 16: the engine's tests)
  model.name = "pretrained"  a local HF checkpoint (model.checkpoint)
  model.name = "random"      random weights at model.preset's published shapes, with the real Qwen vocabulary

and apply the precision and memory knobs (`model.dtype` compute, `model.param_dtype` storage, `model.remat`,
`model.scan_layers`, `model.attention_chunk`, `model.logits_chunk`, `model.num_layers`, `model.vision_depth`)
and the trainable-parameter knobs (`model.lora.*`: adapters on a frozen base, `model.freeze_vision`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping

from jaxwebrl.models.config import ModelConfig, from_hf_dict, tiny_config
from jaxwebrl.models.families import get_family, published_presets
from jaxwebrl.models.lora_config import LoraConfig, parse_targets
from jaxwebrl.parallel.partition import param_shardings


def __getattr__(name: str):
    """`PUBLISHED`: every registered family's published config.json by preset name, read at each access so that a
    family an extension registers after this import is listed too."""
    if name == "PUBLISHED":
        return published_presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TINY_HEAD_DIMS = {"tiny": 16, "tiny_hd32": 32}   # model.name -> the tiny preset's head_dim
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
    published = published_presets()
    if name not in published:
        raise ValueError(f"unknown model preset {name!r}: use one of {', '.join(published)}")
    hf = copy.deepcopy(published[name])
    text = hf["text_config"] if "text_config" in hf else hf
    vision = hf["vision_config"]
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"model.num_layers={num_layers}: must be >= 1 (fewer decoder layers than the preset)")
        text["num_hidden_layers"] = num_layers
    if vision_depth is not None:
        if vision_depth < 1:
            raise ValueError(f"model.vision_depth={vision_depth}: must be >= 1 (fewer vision blocks than the preset)")
        for key in get_family(hf["model_type"]).vision_block_index_keys:
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


def lora_config(section) -> LoraConfig | None:
    """`model.lora` as a LoraConfig (adapters in model.param_dtype), or None when `model.lora.rank` is unset;
    ValueError (one line, naming the known projections) for a rank <= 0 or a target that matches no module."""
    lora = _get(section, "lora")
    rank = _get(lora, "rank") if lora is not None else None
    if rank is None:
        return None
    dtype = _get(section, "dtype", "float32")
    return LoraConfig(rank=rank, alpha=float(_get(lora, "alpha", 16.0)),
                      target_modules=parse_targets(_get(lora, "target_modules", ",".join(LoraConfig.target_modules))),
                      base_dtype=_get(lora, "base_dtype") or "bfloat16",
                      adapter_dtype=_get(section, "param_dtype") or dtype)


def has_vision(config: ModelConfig) -> bool:
    """True when the model has a vision tower with at least one block (False: a text-only model)."""
    return config.family.vision_tower is not None and config.vision.depth > 0


def trainable_knobs(section, config: ModelConfig) -> dict:
    """`lora` and `freeze_vision` of a model section for `config`; freeze_vision on a text-only model is a
    ValueError (one line)."""
    freeze = bool(_get(section, "freeze_vision", False))
    if freeze and not has_vision(config):
        raise ValueError(f"model.freeze_vision=True: the {config.model_type} model has no vision tower to freeze "
                         f"(a text-only model); unset it")
    return {"lora": lora_config(section), "freeze_vision": freeze}


def model_config(section) -> ModelConfig:
    """The ModelConfig a run config's `model` section names (see the module docstring); nothing is loaded."""
    name = _get(section, "name", "tiny")
    dtype = _get(section, "dtype", "float32")
    param_dtype = _get(section, "param_dtype") or dtype
    if name in TINY_HEAD_DIMS:
        config = tiny_config(head_dim=TINY_HEAD_DIMS[name])
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
            raise ValueError(f"model.name='random' needs model.preset (one of {', '.join(published_presets())})")
        config = preset_config(preset, dtype=dtype, param_dtype=param_dtype, num_layers=_get(section, "num_layers"),
                               vision_depth=_get(section, "vision_depth"))
    else:
        raise ValueError(f"model.name={name!r}: use 'tiny', 'tiny_hd32', 'pretrained' or 'random'")
    return config.replace(**knobs(section), **trainable_knobs(section, config))


def shapes_config(section) -> ModelConfig:
    """Like `model_config`, but a 'pretrained' section without a checkpoint falls back to `model.preset`'s
    published shapes (launch/compile.py costs a recipe before any checkpoint exists)."""
    if _get(section, "name") == "pretrained" and not _get(section, "checkpoint") and _get(section, "preset"):
        view = {key: _get(section, key) for key in ("dtype", "param_dtype", "preset", "num_layers", "vision_depth",
                                                     "lora", "freeze_vision", *KNOBS)}
        return model_config({**view, "name": "random"})
    return model_config(section)


def image_processor_for(config: ModelConfig):
    """The family's released image-processor settings at the model's patch and merge sizes."""
    from jaxwebrl.models.processor import ImageProcessor

    v = config.vision
    image = dataclasses.replace(config.family.image_processor(), patch_size=v.patch_size,
                                merge_size=v.spatial_merge_size, temporal_patch_size=v.temporal_patch_size)
    return ImageProcessor(image)


def processor_for(config: ModelConfig):
    """The processor of a random-weights preset: the real Qwen vocabulary + the family's image processor."""
    from jaxwebrl.models.processor import Processor
    from jaxwebrl.models.qwen_vocab import qwen_tokenizer

    return Processor(qwen_tokenizer(), image_processor_for(config))


def build_policy(section, seed: int = 0, *, with_params: bool = True, mesh=None):
    """The Policy a run config's `model` section names, knobs applied. `with_params=False`: params are
    ShapeDtypeStructs (nothing allocated or read). `mesh`: every param is made (random) or read (HF, tensor by
    tensor) straight onto its partition rule's sharding (`parallel/partition.py`), never whole on one device;
    None: on the default device."""
    from jaxwebrl.models.policy import Policy, init_params, init_params_shapes
    from jaxwebrl.models.vl_model import VisionLanguageModel

    name = _get(section, "name", "tiny")
    config = model_config(section)
    if name == "pretrained":
        from jaxwebrl.models.hf_io import _load_processor, load_pretrained

        checkpoint = _get(section, "checkpoint")
        if with_params:
            return load_pretrained(checkpoint, dtype=config.dtype, param_dtype=config.param_dtype,
                                   shardings=None if mesh is None else (lambda shapes: param_shardings(shapes, mesh)),
                                   model_options={**knobs(section), **trainable_knobs(section, config)})
        return Policy(config, VisionLanguageModel(config), init_params_shapes(config), _load_processor(checkpoint))
    if name in TINY_HEAD_DIMS:
        from jaxwebrl.models.processor import tiny_processor

        processor = tiny_processor()
    else:
        processor = processor_for(config)
    if not with_params:
        return Policy(config, VisionLanguageModel(config), init_params_shapes(config), processor)
    module, params = init_params(config, seed, mesh)
    return Policy(config, module, params, processor)
