"""`Policy`: a config, a Flax module and its params, with jitted logits and the seams other parts use."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxwebrl.models import kv_cache, lora
from jaxwebrl.models.config import ModelConfig, tiny_config
from jaxwebrl.models.rope_index import get_rope_index
from jaxwebrl.models.vl_model import VisionLanguageModel, check_image_tokens
from jaxwebrl.parallel import partition


def _grid_key(image_grid_thw):
    """Hashable (static) form of a concrete grid: tuple of (t, h, w) tuples, or None."""
    if image_grid_thw is None:
        return None
    return tuple(tuple(int(v) for v in row) for row in np.asarray(image_grid_thw).reshape(-1, 3))


@functools.partial(jax.jit, static_argnames=("module", "image_grid_thw"))
def _forward(module, params, input_ids, attention_mask, position_ids, pixel_values, image_grid_thw):
    grid = None if image_grid_thw is None else np.asarray(image_grid_thw, np.int64).reshape(-1, 3)
    logits, _ = module.apply(
        {"params": params},
        input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        pixel_values=pixel_values,
        image_grid_thw=grid,
    )
    return logits


@dataclasses.dataclass
class Policy:
    """config (frozen ModelConfig), module (VisionLanguageModel), params (pytree), processor (or None)."""

    config: ModelConfig
    module: VisionLanguageModel
    params: Any
    processor: Any = None

    def logits(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None, position_ids=None):
        """input_ids [B, T] int; attention_mask [B, T] (1 = real) or None; pixel_values [N, C*T*P*P] and
        image_grid_thw [num_images, 3] in transformers' layout -> logits [B, T, V] float32 (jitted; one
        compilation per shape and grid)."""
        ids = jnp.asarray(input_ids, jnp.int32)
        if ids.ndim == 1:
            ids = ids[None]
        mask = None if attention_mask is None else jnp.asarray(attention_mask, jnp.int32).reshape(ids.shape)
        pixels = None if pixel_values is None else jnp.asarray(pixel_values, jnp.dtype(self.config.dtype))
        if (pixels is None) != (image_grid_thw is None):
            raise ValueError("pass pixel_values and image_grid_thw together (or neither)")
        if image_grid_thw is not None:
            check_image_tokens(np.asarray(input_ids).reshape(ids.shape), np.asarray(image_grid_thw).reshape(-1, 3), self.config)
        pos = None if position_ids is None else jnp.asarray(position_ids, jnp.int32)
        return _forward(self.module, self.params, ids, mask, pos, pixels, _grid_key(image_grid_thw))

    def get_rope_index(self, input_ids, image_grid_thw=None, attention_mask=None):
        """(position_ids [3, B, T] int32, rope_deltas [B] int32) for a prompt; see `rope_index`."""
        return get_rope_index(
            input_ids,
            image_grid_thw,
            attention_mask,
            image_token_id=self.config.image_token_id,
            spatial_merge_size=self.config.vision.spatial_merge_size,
        )

    def init_cache(self, batch: int, max_len: int, dtype=None) -> dict:
        """An empty KV cache (see `kv_cache`), in the compute dtype unless `dtype` is given."""
        return kv_cache.init_cache(self.config, batch, max_len, dtype or jnp.dtype(self.config.dtype))

    def replace_params(self, params) -> "Policy":
        return dataclasses.replace(self, params=params)


def merged_policy(policy: Policy, *, copy: bool = False) -> Policy:
    """The same function without adapters: a LoRA policy's kernels merged (`lora.merge_params`), its config
    without `lora` (every weight in the base dtype), a fresh module; any other policy as it is. What the policy
    server decodes with and what the HF export writes."""
    if policy.config.lora is None:
        return policy
    config = policy.config.replace(lora=None, param_dtype=policy.config.base_param_dtype)
    params = lora.merge_params(policy.params, policy.config.lora, copy=copy)
    return dataclasses.replace(policy, config=config, module=VisionLanguageModel(config), params=params)


def _init_fn(config: ModelConfig):
    """rng -> params, tracing a 1-image dummy batch so the vision tower is built too."""
    module = VisionLanguageModel(config)
    merge = config.vision.spatial_merge_size
    grid = np.array([[1, merge, merge]])
    ids = np.array([[0, config.image_token_id, 0]], np.int32)
    pixels = jnp.zeros((merge * merge, config.vision.patch_dim), jnp.float32)
    return module, lambda rng: module.init(rng, ids, pixel_values=pixels, image_grid_thw=grid)["params"]


@functools.lru_cache(maxsize=8)
def _jitted_init(config: ModelConfig, mesh: Mesh | None):
    module, init = _init_fn(config)
    if mesh is None:
        return module, jax.jit(init)
    shapes = jax.eval_shape(init, jax.random.PRNGKey(0))
    return module, jax.jit(init, out_shardings=partition.param_shardings(shapes, mesh))


def init_params(config: ModelConfig, seed: int = 0, mesh: Mesh | None = None):
    """(module, random params) for `config`; the init program compiles once per config (and mesh). With `mesh`,
    every param is made on its partition rule's sharding (`parallel/partition.py`), each device computing only its
    own shard, never the whole tree on one device: the same values as without (JAX's partitionable threefry)."""
    module, init = _jitted_init(config, mesh)
    return module, init(jax.random.PRNGKey(seed))


def init_params_shapes(config: ModelConfig):
    """Pytree of jax.ShapeDtypeStruct of `config`'s params (nothing is allocated)."""
    _, init = _init_fn(config)
    return jax.eval_shape(init, jax.random.PRNGKey(0))


def _tiny_processor_or_none():
    try:
        from jaxwebrl.models.processor import tiny_processor
    except ImportError:
        return None
    return tiny_processor()


def tiny_policy(seed: int = 0, *, remat: bool = False) -> Policy:
    """Random `tiny` Qwen3-VL policy for CPU runs and tests, with the tiny processor attached."""
    config = tiny_config(remat=remat)
    module, params = init_params(config, seed)
    return Policy(config, module, params, _tiny_processor_or_none())
