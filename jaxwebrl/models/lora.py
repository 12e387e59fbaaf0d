"""LoRA on the text decoder's named projections: y = x W (+ b) + (alpha / rank) (x A) B, the base W frozen.

`LoraConfig(rank, alpha, target_modules, base_dtype)` (`models/lora_config.py`) sits on `ModelConfig.lora` (None:
no adapters). Each targeted projection (`TARGET_MODULES`: the decoder's attention and MLP projections) is a
`LoraDense`: the base `kernel` [in, out] (and `bias`) where `nn.Dense` keeps them, plus `lora_a` [in, r] (uniform
±1/sqrt(in)) and `lora_b` [r, out] (zeros), so a fresh adapter computes exactly the base function. With
`scan_layers` the adapters are stacked like every layer leaf ([L, in, r], [L, r, out]). The base weights are held
in `base_dtype`; the adapters in the model's `param_dtype`.

`merge_params(params, lora)` folds every adapter into its kernel (W + (alpha / r) A B, in fp32, stored in the
kernel's dtype) and drops the adapter leaves: the tree of the same model without LoRA (the policy server's and the
HF export's weights). `with_adapters(params, shapes, seed)` adds fresh adapters to a base tree that has none (an
HF checkpoint loaded into a LoRA model).

Why not qwix: it would be a new dependency of every trainer and worker process, and it adds adapters by
intercepting the matmuls of a wrapped module at trace time; here every decoder projection already goes through
one helper (`layers.dense`), so an explicit module keeps the adapter leaves at fixed, visible paths that the
HF param map, the trainable-parameter split (`train/trainable.py`), the merge and the checkpoints all read.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jaxwebrl.models.lora_config import LoraConfig

ADAPTER_LEAVES = ("lora_a", "lora_b")


class LoraDense(nn.Module):
    """`nn.Dense` (kernel [in, out], the same computation) plus the adapter pair; see the module docstring."""

    features: int
    lora: LoraConfig
    use_bias: bool = False
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: callable = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """x [..., in] -> [..., features] in `dtype`."""
        fan_in = x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (fan_in, self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype) if self.use_bias else None
        adapter_dtype = jnp.dtype(self.lora.adapter_dtype)
        a = self.param("lora_a", nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
                       (fan_in, self.lora.rank), adapter_dtype)
        b = self.param("lora_b", nn.initializers.zeros, (self.lora.rank, self.features), adapter_dtype)
        x, kernel, bias, a, b = nn.dtypes.promote_dtype(x, kernel, bias, a, b, dtype=self.dtype)
        dims = (((x.ndim - 1,), (0,)), ((), ()))
        y = jax.lax.dot_general(x, kernel, dims)
        if bias is not None:
            y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        delta = jax.lax.dot_general(jax.lax.dot_general(x, a, dims), b, dims)
        return y + (self.lora.scale * delta).astype(y.dtype)


def _adapted(flat: dict) -> list[tuple]:
    """Paths (without the leaf name) of the projections in a flat params dict that carry adapters."""
    return [path[:-1] for path in flat if path[-1] == "lora_a"]


def is_adapter(path: tuple) -> bool:
    """True for a params path (a tuple of keys) that ends in an adapter leaf."""
    return bool(path) and str(path[-1]) in ADAPTER_LEAVES


def has_adapters(params) -> bool:
    return any(is_adapter(path) for path in traverse_util.flatten_dict(params))


def merge_params(params, lora: LoraConfig | None, *, copy: bool = False):
    """The tree without adapters: every adapted kernel becomes W + (alpha / r) A B (fp32 math, the kernel's dtype);
    [L, ...] stacked leaves merge layer by layer. `copy=True` also copies the untouched leaves (the update donates
    its buffers, so what is published must not alias them). Without `lora` the tree is returned (copied if asked)."""
    if lora is None or not has_adapters(params):
        return jax.tree.map(lambda x: x.copy(), params) if copy else params
    flat = traverse_util.flatten_dict(params)
    out = {path: (leaf.copy() if copy else leaf) for path, leaf in flat.items() if not is_adapter(path)}
    for module in _adapted(flat):
        kernel = flat[module + ("kernel",)]
        out[module + ("kernel",)] = _merged(kernel, flat[module + ("lora_a",)], flat[module + ("lora_b",)],
                                            jnp.float32(lora.scale))
    return traverse_util.unflatten_dict(out)


@jax.jit
def _merged(kernel, a, b, scale):
    """kernel [..., in, out] + scale * a [..., in, r] @ b [..., r, out], in fp32, stored in the kernel's dtype."""
    delta = jnp.einsum("...ir,...ro->...io", a.astype(jnp.float32), b.astype(jnp.float32))
    return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)


def with_adapters(params, shapes, seed: int = 0):
    """`params` (a base tree without adapters) with the adapter leaves `shapes` (the LoRA model's
    ShapeDtypeStructs) holds: A uniform ±1/sqrt(in), B zeros, each placed on the kernel's sharding."""
    flat = traverse_util.flatten_dict(params)
    wanted = {path: leaf for path, leaf in traverse_util.flatten_dict(shapes).items() if is_adapter(path)}
    key = jax.random.key(seed)
    for i, (path, shape) in enumerate(sorted(wanted.items())):
        if path in flat:
            continue
        if path[-1] == "lora_a":
            fan_in = shape.shape[-2]
            bound = 1.0 / np.sqrt(fan_in)
            value = jax.random.uniform(jax.random.fold_in(key, i), shape.shape, jnp.float32, -bound, bound)
        else:
            value = jnp.zeros(shape.shape, jnp.float32)
        value = value.astype(shape.dtype)
        kernel = flat.get(path[:-1] + ("kernel",))
        sharding = getattr(kernel, "sharding", None)
        if sharding is not None and hasattr(sharding, "mesh"):
            value = jax.device_put(value, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))
        flat[path] = value
    return traverse_util.unflatten_dict(flat)
