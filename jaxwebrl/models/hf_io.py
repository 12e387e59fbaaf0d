"""Hugging Face checkpoint import/export for Qwen3-VL and Qwen2.5-VL policies.

`load_pretrained` reads config.json, then streams the (sharded) safetensors tensor by tensor: each tensor is
read, transformed to its Flax layout, cast, and placed directly on its target sharding before the next one
is read, so host memory holds about one tensor at a time. `save_pretrained` writes config.json and
safetensors shards (5 GB each by default) that `transformers` loads, one parameter fetched at a time.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxwebrl.models import lora, param_map, safetensors_io
from jaxwebrl.models.config import ModelConfig, from_hf_dict, to_hf_dict
from jaxwebrl.models.policy import Policy, init_params_shapes, merged_policy
from jaxwebrl.models.vl_model import VisionLanguageModel


def read_config(hf_dir: str, dtype: str = "float32", param_dtype: str | None = None) -> ModelConfig:
    path = os.path.join(hf_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: load_pretrained expects a Hugging Face checkpoint directory")
    with open(path, encoding="utf-8") as f:
        return from_hf_dict(json.load(f), dtype=dtype, param_dtype=param_dtype)


def fsdp_shardings(shapes, mesh: Mesh, axis: str | tuple[str, ...] | None = None):
    """Simple FSDP-style shardings: each leaf's largest dimension divisible by the axis size is split over
    `axis` (default: all mesh axes together); other leaves are replicated. Returns a pytree of NamedSharding.
    """
    axis = tuple(mesh.axis_names) if axis is None else axis
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    size = int(np.prod([mesh.shape[a] for a in names]))

    def one(leaf):
        spec = [None] * len(leaf.shape)
        for dim in sorted(range(len(leaf.shape)), key=lambda d: -leaf.shape[d]):
            if leaf.shape[dim] % size == 0 and leaf.shape[dim] >= size:
                spec[dim] = names if len(names) > 1 else names[0]
                break
        return NamedSharding(mesh, PartitionSpec(*spec))

    return jax.tree_util.tree_map(one, shapes)


def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _place(array: np.ndarray, sharding) -> jax.Array:
    if sharding is None:
        return jnp.asarray(array)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def _stacked_buffer(shape, dtype, sharding) -> jax.Array:
    """Zeros [L, ...] on `sharding` (or the default device): the stacked leaf the layers are written into."""
    make = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding) if sharding is not None else \
        (lambda: jnp.zeros(shape, dtype))
    return make()


@functools.partial(jax.jit, donate_argnums=(0,))
def _write_layer(stacked: jax.Array, layer: jax.Array, index) -> jax.Array:
    """stacked [L, ...] with stacked[index] = layer (in place: the buffer is donated)."""
    return jax.lax.dynamic_update_index_in_dim(stacked, layer.astype(stacked.dtype), index, 0)


def load_pretrained(
    hf_dir: str,
    dtype: str = "float32",
    mesh: Mesh | None = None,
    *,
    shardings: Any = None,
    param_dtype: str | None = None,
    with_processor: bool = True,
    model_options: dict | None = None,
) -> Policy:
    """Policy from a local HF checkpoint directory (config.json names a registered model_type: qwen3_vl, qwen2_5_vl).

    dtype: compute dtype (and param dtype unless `param_dtype` is given). shardings: a pytree of
    jax.sharding.Sharding matching the params, or a callable(shapes_pytree) -> such a pytree; with only
    `mesh`, `fsdp_shardings` is used. Without either, params land on the default device.
    model_options: ModelConfig knobs (`remat`, `scan_layers`, `attention_chunk`, `logits_chunk`, `lora`,
    `freeze_vision`); with scan_layers the decoder layers load into stacked leaves; with `lora` the weights load in
    `lora.base_dtype` and fresh adapters (B = 0: the loaded function) are added.
    """
    config = read_config(hf_dir, dtype, param_dtype).replace(**dict(model_options or {}))
    safetensors_io.return_freed_buffers_to_os()
    module = VisionLanguageModel(config)
    shapes = init_params_shapes(config)
    if shardings is None and mesh is not None:
        shardings = fsdp_shardings(shapes, mesh)
    elif callable(shardings):
        shardings = shardings(shapes)
    target_dtype = np.dtype(jnp.dtype(config.base_param_dtype))
    by_name = {spec.hf_name: spec for spec in config.family.param_specs(config)}
    params: dict = {}
    loaded, unexpected = set(), []
    for name, handle in safetensors_io.iter_tensors(hf_dir):
        canonical = param_map.canonical_hf_name(name)
        spec = by_name.get(canonical)
        if spec is None:
            if canonical == "lm_head.weight" and config.tie_word_embeddings:
                continue  # tied head: the embedding serves as the head
            unexpected.append(name)
            continue
        array = param_map.hf_to_flax(handle.read(name), spec.kind)
        full = tuple(_get(shapes, spec.path).shape)
        expected = full if spec.layer is None else full[1:]
        if array.shape != expected:
            raise ValueError(
                f"{name}: checkpoint shape {handle.shape(name)} does not match config.json "
                f"(expects Flax {spec.path} of shape {expected})"
            )
        # One transformed host copy, and the raw read buffer is dropped before placing: at most two
        # copies of this tensor exist at any moment (raw + transformed, then transformed + placed).
        array = np.ascontiguousarray(array.astype(target_dtype, copy=False))
        sharding = None if shardings is None else _get(shardings, spec.path)
        if spec.layer is None:
            _set(params, spec.path, _place(array, sharding))
        else:  # scan_layers: write layer i of the stacked leaf on the device
            try:
                stacked = _get(params, spec.path)
            except KeyError:
                stacked = _stacked_buffer(full, target_dtype, sharding)
            layer_sharding = None if sharding is None else jax.sharding.NamedSharding(
                sharding.mesh, jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:]))
            _set(params, spec.path, _write_layer(stacked, _place(array, layer_sharding), np.int32(spec.layer)))
        loaded.add(canonical)
        del array
    missing = sorted(set(by_name) - loaded)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {hf_dir} does not match its config.json: missing {missing[:8]}"
            f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}"
        )
    if config.lora is not None:
        params = lora.with_adapters(params, shapes)
    processor = _load_processor(hf_dir) if with_processor else None
    return Policy(config, module, params, processor)


def _load_processor(hf_dir: str):
    """The HF-equal processor when the directory has tokenizer + preprocessor files, else None."""
    if not (
        os.path.exists(os.path.join(hf_dir, "tokenizer.json"))
        and os.path.exists(os.path.join(hf_dir, "preprocessor_config.json"))
    ):
        return None
    from jaxwebrl.models.processor import Processor

    return Processor.from_pretrained(hf_dir)


def _to_host(leaf) -> np.ndarray:
    """A full host copy of one parameter, gathering shards from other processes when needed."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(jax.device_get(leaf))


def _hf_array(params, spec, conv_shape, store: np.dtype) -> np.ndarray:
    """One parameter as the HF checkpoint holds it (host copy, HF layout, `store` dtype)."""
    leaf = _get(params, spec.path)
    host = _to_host(leaf if spec.layer is None else leaf[spec.layer])
    return param_map.flax_to_hf(host, spec.kind, conv_shape).astype(store)


def hf_arrays(config: ModelConfig, params, dtype: str | None = None) -> dict[str, np.ndarray]:
    """{HF name: host array} of `params`, exactly what `save_pretrained` writes (the export mapping): the weights a
    serving engine loads by name (rollout/engines: a push per policy version)."""
    store = np.dtype(jnp.dtype(dtype or config.param_dtype))
    conv_shape = param_map.conv_hf_shape(config)
    return {config.family.hf_disk_name(spec.hf_name): _hf_array(params, spec, conv_shape, store)
            for spec in config.family.param_specs(config)}


def save_pretrained(policy: Policy, out_dir: str, *, max_shard_bytes: int = 5 * 2**30, dtype: str | None = None) -> None:
    """Write config.json + safetensors (sharded past `max_shard_bytes`, with an index) that transformers loads.

    dtype: storage dtype of the tensors (default: the params' dtype). The processor's files are written too
    when the policy has one with `save_pretrained`. A LoRA policy is written merged (`policy.merged_policy`).
    """
    policy = merged_policy(policy)
    config = policy.config
    writer = jax.process_index() == 0  # every process gathers (collective), only the first writes
    if writer:
        os.makedirs(out_dir, exist_ok=True)
    store = np.dtype(jnp.dtype(dtype or config.param_dtype))
    specs = config.family.param_specs(config)
    conv_shape = param_map.conv_hf_shape(config)
    rows = []
    for spec in specs:
        leaf = _get(policy.params, spec.path)
        shape = tuple(leaf.shape) if spec.layer is None else tuple(leaf.shape)[1:]
        if spec.kind == "linear":
            shape = shape[::-1]
        elif spec.kind == "conv":
            shape = conv_shape
        rows.append((spec, shape))
    shards, current, size = [], [], 0
    for spec, shape in rows:
        nbytes = int(np.prod(shape, dtype=np.int64)) * store.itemsize
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((spec, shape))
        size += nbytes
    shards.append(current)
    disk_name = config.family.hf_disk_name   # Qwen2.5-VL: the legacy names transformers itself writes
    by_name = {disk_name(spec.hf_name): spec for spec in specs}

    def fetch(name: str) -> np.ndarray:
        return _hf_array(policy.params, by_name[name], conv_shape, store)

    weight_map = {}
    for i, shard in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        layout = [(disk_name(s.hf_name), shape, store) for s, shape in shard]
        if writer:
            safetensors_io.write_file(os.path.join(out_dir, file), layout, fetch)
        else:
            for name, _, _ in layout:
                fetch(name)  # take part in the gathers
        weight_map.update({disk_name(s.hf_name): file for s, _ in shard})
    if not writer:
        return
    if len(shards) > 1:
        total = sum(int(np.prod(shape, dtype=np.int64)) * store.itemsize for _, shape in rows)
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    hf_config = to_hf_dict(config)
    hf_config["dtype"] = store.name
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    if policy.processor is not None and hasattr(policy.processor, "save_pretrained"):
        policy.processor.save_pretrained(out_dir)

