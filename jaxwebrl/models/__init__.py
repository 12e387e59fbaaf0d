"""jaxwebrl.models: Flax Qwen3-VL / Qwen2.5-VL policies, KV cache, rope index, HF import/export."""

from jaxwebrl.models.config import ModelConfig, TextConfig, VisionConfig, small_config, tiny_config
from jaxwebrl.models.hf_io import fsdp_shardings, load_pretrained, save_pretrained
from jaxwebrl.models.kv_cache import init_cache
from jaxwebrl.models.policy import Policy, init_params, tiny_policy
from jaxwebrl.models.rope_index import get_rope_index
from jaxwebrl.models.vl_model import VisionLanguageModel

__all__ = [
    "ModelConfig",
    "TextConfig",
    "VisionConfig",
    "tiny_config",
    "small_config",
    "init_cache",
    "load_pretrained",
    "save_pretrained",
    "fsdp_shardings",
    "Policy",
    "init_params",
    "tiny_policy",
    "get_rope_index",
    "VisionLanguageModel",
]
