"""The model families by `model_type`: one `ModelFamily` record of hooks per family folder, and its registry.

A family is a folder `jaxwebrl/models/<model_type>/` holding what is its own (config.json translation, vision
tower, params map, published presets) and a `family.py` that calls `register_family(ModelFamily(...))`. The shared
layers (decoder, attention, KV cache, LM head, sampler, processor) read a config's family through
`config.family` (= `get_family(config.model_type)`) and never branch on the name.

Adding a family: one folder, and its `family` module in `BUILT_IN` (or, from outside the package, in
`config.extensions`: `jaxwebrl.extensions` imports it first in every process).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxwebrl.extensions import ImportOnce

# The families shipped with jaxwebrl, imported on the first lookup (their modules import this one).
BUILT_IN = ("jaxwebrl.models.qwen3_vl.family", "jaxwebrl.models.qwen2_5_vl.family")


def _text_config_section(hf: Mapping[str, Any]) -> dict:
    return dict(hf.get("text_config") or {})


def _same(value):
    return value


def _no_stacks(config) -> list:
    return []


def _top_level_as_is(out: dict, text: dict) -> dict:
    return out


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """What one family adds to the shared model code (`config` below is a `ModelConfig` of this family).

    config.json -> ModelConfig (`config.from_hf_dict`):
      text_section(hf) -> dict            the text fields of config.json (default: its `text_config`)
      text_fields(text) -> dict           the TextConfig fields that are the family's (qk_norm, attention_bias, ...)
      vision_fields(vision) -> dict       the VisionConfig fields that are the family's (hidden_act, ...)
    ModelConfig -> config.json (`config.to_hf_dict`):
      hf_text(config) -> dict             the family's entries of `text_config` (may refuse a config: ValueError)
      hf_vision(config) -> dict           the family's entries of `vision_config`
      hf_top_level(out, text) -> dict     config.json without its sections -> as the family writes it
    Weights and layout:
      vision_tower(config, dtype, param_dtype) -> nn.Module    the tower `VisionLanguageModel.visual`
      param_specs(config) -> [ParamSpec]  every tensor, HF name <-> Flax path (`param_map`)
      vision_stacks(config) -> [(stacked name, first block, count)]   the tower's scan_layers stacks (`stacking`)
      hf_disk_name(name) -> name          the tensor name written to safetensors (default: the canonical one)
    Presets and costs:
      image_processor() -> ImageProcessorConfig   the released image-processor settings
      presets                             name -> published config.json (`presets.PUBLISHED`)
      vision_block_index_keys             the vision config.json keys that list block indexes (rescaled with depth)
      vision_mlp_matrices                 weight matrices of a vision block's MLP (`parallel.cost`)
      vision_window_attention             blocks outside `fullatt_block_indexes` attend within windows
    """

    model_type: str
    architecture: str
    text_fields: Callable[[Mapping[str, Any]], dict]
    vision_fields: Callable[[Mapping[str, Any]], dict]
    hf_text: Callable[[Any], dict]
    hf_vision: Callable[[Any], dict]
    vision_tower: Callable[..., Any]
    param_specs: Callable[[Any], list]
    image_processor: Callable[[], Any]
    text_section: Callable[[Mapping[str, Any]], dict] = _text_config_section
    hf_top_level: Callable[[dict, dict], dict] = _top_level_as_is
    vision_stacks: Callable[[Any], list] = _no_stacks
    hf_disk_name: Callable[[str], str] = _same
    presets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    vision_block_index_keys: tuple[str, ...] = ()
    vision_mlp_matrices: int = 2
    vision_window_attention: bool = False


_FAMILIES: dict[str, ModelFamily] = {}
_load_built_in = ImportOnce(BUILT_IN)   # the built-in families register on import


def register_family(family: ModelFamily) -> ModelFamily:
    """Make `family.model_type` a model_type every config may name. Registering the same record again is a
    no-op; another record under a taken model_type, or a preset name another family has, is a ValueError."""
    if not isinstance(family, ModelFamily):
        raise TypeError(f"register_family takes a ModelFamily, got {type(family).__name__}")
    if not family.model_type or not isinstance(family.model_type, str):
        raise ValueError(f"ModelFamily.model_type={family.model_type!r}: give the config.json model_type")
    if _FAMILIES.get(family.model_type, family) != family:
        raise ValueError(f"model_type {family.model_type!r} is already registered: choose another model_type")
    taken = {name: other.model_type for other in _FAMILIES.values() if other.model_type != family.model_type
             for name in other.presets}
    clash = sorted(set(family.presets) & set(taken))
    if clash:
        raise ValueError(f"preset names {clash} of {family.model_type!r} belong to {taken[clash[0]]!r}: rename them")
    _FAMILIES[family.model_type] = family
    return family


def supported_model_types() -> tuple[str, ...]:
    _load_built_in()
    return tuple(_FAMILIES)


def get_family(model_type: str) -> ModelFamily:
    """The registered family of `model_type`; an unknown one is a ValueError naming the supported types."""
    _load_built_in()
    family = _FAMILIES.get(model_type)
    if family is None:
        raise ValueError(f"model_type {model_type!r} is not supported: use one of {', '.join(_FAMILIES)} "
                         "(or register a family with jaxwebrl.models.families.register_family)")
    return family


def published_presets() -> dict[str, Mapping[str, Any]]:
    """Every family's published config.json by preset name, in registration order."""
    _load_built_in()
    return {name: hf for family in _FAMILIES.values() for name, hf in family.presets.items()}
