"""Partition rules for every parameter of the Qwen-VL families, and jit helpers with in/out shardings.

A rule is `(regex, PartitionSpec)`; the first regex that `re.search`es a parameter's path ("a/b/kernel")
gives its spec. A parameter that no rule matches is an error (a new layer must get a rule, not silently
replicate). Mesh axes whose size does not divide the dimension they would shard are dropped for that
parameter (e.g. an MLP width of 172 is not split 8 ways), so any preset runs on any mesh.

Layout (Megatron tensor parallel + FSDP): column-parallel kernels `[in, out]` are (`fsdp`, `tensor`),
row-parallel kernels are (`tensor`, `fsdp`), the vocabulary is split over `tensor`, norms are replicated.
The sharding never changes results, only where the work runs: `jax.jit` computes the same global function.

Mixed precision: keep an fp32 master copy of the parameters in the train state and run the model in bf16 by
wrapping the loss with `compute_in(dtype)`; gradients arrive in fp32, matched to the master copy.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.sharding import PartitionSpec as P

from jaxwebrl.parallel.mesh import AXES, BATCH_AXES, batch_spec, context_mesh

Rules = Sequence[tuple[str, PartitionSpec]]

COLUMN = P("fsdp", "tensor")  # [in, out]: outputs split over tensor
ROW = P("tensor", "fsdp")  # [in, out]: inputs split over tensor
REPLICATED = P()

# Text decoder (shared by Qwen3-VL and Qwen2.5-VL).
TEXT_RULES: Rules = (
    (r"language_model/embed_tokens/embedding$", P("tensor", "fsdp")),  # [V, E]
    (r"self_attn/[qkv]_proj/kernel$", COLUMN),  # [E, heads·D]
    (r"self_attn/[qkv]_proj/bias$", P("tensor")),
    (r"self_attn/o_proj/kernel$", ROW),  # [heads·D, E]
    (r"self_attn/[qk]_norm/weight$", REPLICATED),
    (r"language_model/.*mlp/(gate|up)_proj/kernel$", COLUMN),
    (r"language_model/.*mlp/down_proj/kernel$", ROW),
    (r"(input_layernorm|post_attention_layernorm)/weight$", REPLICATED),
    (r"language_model/norm/weight$", REPLICATED),
    (r"lm_head/weight$", P("tensor", "fsdp")),  # [V, E], like the embedding
)

# Vision towers: Qwen3-VL (LayerNorm, GELU MLP, learned position table, DeepStack mergers) and
# Qwen2.5-VL (RMSNorm, SwiGLU MLP). The fused qkv output is [3·heads·D]; it is split over fsdp on its input
# side only, so heads are not cut across the q/k/v boundary.
VISION_RULES: Rules = (
    (r"visual/patch_embed/.*kernel$", P(None, "fsdp")),  # [C·T·P·P, Hv]
    (r"visual/patch_embed/.*bias$", REPLICATED),
    (r"visual/pos_embed(/embedding)?$", P(None, "fsdp")),  # [num_positions, Hv]
    (r"visual/.*attn/qkv/kernel$", P("fsdp", None)),
    (r"visual/.*attn/qkv/bias$", REPLICATED),
    (r"visual/.*attn/proj/kernel$", P(None, "fsdp")),
    (r"visual/.*attn/proj/bias$", REPLICATED),
    (r"visual/blocks_[\d_to]+/mlp/(linear_fc1|gate_proj|up_proj)/kernel$", COLUMN),
    (r"visual/blocks_[\d_to]+/mlp/(linear_fc1|gate_proj|up_proj)/bias$", P("tensor")),
    (r"visual/blocks_[\d_to]+/mlp/(linear_fc2|down_proj)/kernel$", ROW),
    (r"visual/blocks_[\d_to]+/mlp/(linear_fc2|down_proj)/bias$", REPLICATED),
    # Patch mergers: Qwen3-VL names the two linears linear_fc1/linear_fc2, Qwen2.5-VL mlp_0/mlp_2.
    (r"visual/(merger|deepstack_merger_list_\d+)/(linear_fc1|mlp_0)/kernel$", COLUMN),
    (r"visual/(merger|deepstack_merger_list_\d+)/(linear_fc1|mlp_0)/bias$", P("tensor")),
    (r"visual/(merger|deepstack_merger_list_\d+)/(linear_fc2|mlp_2)/kernel$", ROW),
    (r"visual/(merger|deepstack_merger_list_\d+)/(linear_fc2|mlp_2)/bias$", REPLICATED),
    (r"visual/.*(norm\w*|ln_q)/(weight|scale|bias)$", REPLICATED),
)

# LoRA adapters (models/lora.py: lora_a [in, r], lora_b [r, out]) are small: every chip holds them whole.
LORA_RULES: Rules = ((r"/lora_[ab]$", REPLICATED),)

DEFAULT_RULES: Rules = LORA_RULES + TEXT_RULES + VISION_RULES


def path_string(path: Sequence[Any]) -> str:
    """A pytree key path as "a/b/kernel" (dict keys, attribute names and list indices alike)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """`spec` for an array of `shape`, padded to its rank, with axes that do not divide their dimension dropped."""
    if len(spec) > len(shape):
        raise ValueError(f"partition spec {spec} has more entries than the array has dimensions {tuple(shape)}")
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        kept, size = [], 1
        for name in names:
            if dim % (size * mesh.shape[name]) == 0:
                kept.append(name)
                size *= mesh.shape[name]
        fitted.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*fitted)


def spec_for(path: str, rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """The first matching rule's spec for a parameter path; KeyError naming the path when none matches."""
    for pattern, spec in rules:
        if re.search(pattern, path):
            return spec
    raise KeyError(
        f"no partition rule matches parameter {path!r}: add a (regex, PartitionSpec) rule for it to "
        "jaxwebrl/parallel/partition.py"
    )


# Stacked layer params (scan_layers): leaves [L, ...] under language_model/layers/ and the Qwen3-VL tower's
# visual/blocks_{a}_to_{b}/ keep the layer axis whole.
STACKED_LAYERS = re.compile(r"(^|/)(language_model/layers|visual/blocks_\d+_to_\d+)/")


def param_spec(path: str, shape: Sequence[int], mesh: Mesh, rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """The shape-fitted spec of one parameter; a stacked layer leaf gets its layer's spec behind a whole L axis."""
    spec = spec_for(path, rules)
    if STACKED_LAYERS.search(path):
        spec = P(None, *spec)
    return fit_spec(spec, shape, mesh)


def partition_specs(params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """Pytree of PartitionSpec, one per parameter (shape-fitted to `mesh`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: param_spec(path_string(path), np.shape(leaf), mesh, rules), params
    )


def param_shardings(params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """Pytree of NamedSharding, one per parameter. `params` may hold arrays or ShapeDtypeStructs."""
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), partition_specs(params, mesh, rules))


def state_specs(tree: Any, mesh: Any, replicated: str | None = None) -> Any:
    """PartitionSpecs of a params-shaped pytree nested anywhere (optimizer state, a critic's state): each leaf by the
    partition rule its path ends with; scalars, and leaves whose path holds the key `replicated`, replicated.
    `mesh`: a Mesh or the abstract mesh in context."""
    def one(path, leaf):
        path = path_string(path)
        if not np.shape(leaf) or (replicated and replicated in path.split("/")):
            return P()
        return param_spec(path, np.shape(leaf), mesh)

    return jax.tree_util.tree_map_with_path(one, tree)


def state_shardings(tree: Any, mesh: Mesh, replicated: str | None = None) -> Any:
    """NamedShardings of `state_specs` on `mesh`. `tree` may hold arrays or ShapeDtypeStructs."""
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), state_specs(tree, mesh, replicated))


def init_state(init: Callable[[Any], Any], params: Any, replicated: str | None = None) -> Any:
    """`init(params)` (e.g. an optimizer's `init`) with its outputs on `state_shardings` over the mesh `params` live
    on, so every AdamW moment is sharded like its parameter; plain `init(params)` when `params` are on no mesh.
    (A bare `jax.jit(init)` puts the zeros it makes on one device: XLA does not propagate an input's sharding to
    a constant.)"""
    meshes = {leaf.sharding.mesh for leaf in jax.tree_util.tree_leaves(params)
              if isinstance(getattr(leaf, "sharding", None), NamedSharding)}
    if not meshes:
        return init(params)
    if len(meshes) > 1:
        raise ValueError("the params live on several meshes: place them on one (partition.param_shardings)")
    mesh = meshes.pop()
    return jax.jit(init, out_shardings=state_shardings(jax.eval_shape(init, params), mesh, replicated))(params)


def constrain_state(tree: Any, replicated: str | None = None) -> Any:
    """`tree` (params or optimizer state) held to its partition rules (`state_specs`) when a mesh with the axes
    (`data`, `fsdp`, `tensor`) is in context (`jax.set_mesh`); unchanged otherwise. For a jitted step's updated
    state: XLA's propagation may otherwise give an output another layout than the input it replaces (a norm's
    weight split over `fsdp`), so the next call recompiles and the state drifts off the rules."""
    mesh = context_mesh(AXES)
    return tree if mesh is None else jax.lax.with_sharding_constraint(tree, state_specs(tree, mesh, replicated))


def lookup_table(table: jax.Array) -> jax.Array:
    """An embedding table [V, E] for a token lookup, held to its vocabulary split over `tensor` with the embed dim
    whole (gathered over `fsdp`, as FSDP gathers a weight before its use) when a mesh with the axes is in context
    (`jax.set_mesh`); unchanged otherwise. Looked up from the stored (`tensor`, `fsdp`) layout, the rows [B, T, E]
    come out split over `fsdp` on E, not on B: with `data` > 1 XLA replicated the activations (and their
    gradient) to go from one layout to the other ("involuntary full rematerialization")."""
    mesh = context_mesh(AXES)
    if mesh is None:
        return table
    return jax.lax.with_sharding_constraint(table, fit_spec(P("tensor", None), table.shape, mesh))


def data_shardings(tree: Any, mesh: Mesh) -> Any:
    """Shardings for a batch pytree: leading dimension over (`data`, `fsdp`) when it divides, else replicated."""

    def one(leaf):
        shape = np.shape(leaf)
        if not shape:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, fit_spec(batch_spec(len(shape)), shape, mesh))

    return jax.tree_util.tree_map(one, tree)


def cache_shardings(cache: Mapping[str, Any], mesh: Mesh) -> Any:
    """KV-cache shardings: k/v `[B, K, S, D]` over (batch axes, `tensor`, -, -); per-row arrays over batch axes."""

    def one(path, leaf):
        shape = np.shape(leaf)
        if path_string(path).endswith(("/k", "/v")):
            return NamedSharding(mesh, fit_spec(P(BATCH_AXES, "tensor", None, None), shape, mesh))
        return NamedSharding(mesh, fit_spec(batch_spec(len(shape)), shape, mesh) if shape else P())

    return jax.tree_util.tree_map_with_path(one, cache)


def grid_key(image_grid_thw) -> tuple[tuple[int, int, int], ...] | None:
    """Hashable (static) form of `image_grid_thw [n, 3]` for jit's static arguments."""
    if image_grid_thw is None:
        return None
    return tuple(tuple(int(x) for x in row) for row in np.asarray(image_grid_thw).reshape(-1, 3))


def committed(tree: Any) -> Any:
    """`tree` with each uncommitted jax.Array committed to the device it is on (no copy, no move), as an Orbax restore
    gives them. jit keys a compiled program on whether each argument is committed, so a fresh start (uncommitted
    arrays) and a resumed one would otherwise compile every program twice and never share them in the persistent
    cache. Committed arrays (a mesh run's NamedShardings) and other leaves are left as they are."""

    def commit(x):
        if isinstance(x, jax.Array) and not x.committed:
            return jax.device_put(x, next(iter(x.devices())))
        return x

    return jax.tree.map(commit, tree)


def cast_floating(tree: Any, dtype) -> Any:
    """Casts the floating-point leaves of `tree` to `dtype` (ints and bools untouched)."""
    dtype = jnp.dtype(dtype)
    return jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, tree
    )


def compute_in(dtype, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps `loss_fn(params, *args)` to run on `params` cast to `dtype` (e.g. bf16) from an fp32 master copy.

    Differentiating the wrapper w.r.t. the fp32 params yields fp32 gradients (the cast's transpose casts back).
    Pair it with a module built at `dtype=param_dtype="bfloat16"` so the activations are bf16 too.
    """

    def wrapped(params, *args, **kwargs):
        return loss_fn(cast_floating(params, dtype), *args, **kwargs)

    return wrapped


def sharded_forward(module, mesh: Mesh, shardings: Any) -> Callable[..., jax.Array]:
    """Jitted `logits = f(params, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None)`.

    params on `shardings` (from `param_shardings`), input_ids / attention_mask `[B, T]` batch-sharded,
    pixel_values `[P, patch_dim]` replicated, image_grid_thw static (one compilation per image layout).
    Returns logits `[B, T, V] float32`, batch-sharded.
    """
    logits_sharding = NamedSharding(mesh, batch_spec(3))

    def forward(params, input_ids, attention_mask, pixel_values, grid):
        logits, _ = module.apply({"params": params}, input_ids, attention_mask=attention_mask,
                                 pixel_values=pixel_values, image_grid_thw=None if grid is None else np.asarray(grid))
        return jax.lax.with_sharding_constraint(logits, logits_sharding)

    jitted = jax.jit(forward, static_argnums=(4,), out_shardings=logits_sharding)

    def call(params, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None):
        input_ids = _put(jnp.asarray(input_ids, jnp.int32), mesh)
        if attention_mask is None:
            attention_mask = jnp.ones(input_ids.shape, jnp.int32)
        attention_mask = _put(jnp.asarray(attention_mask, jnp.int32), mesh)
        if pixel_values is not None:
            pixel_values = jax.device_put(jnp.asarray(pixel_values), NamedSharding(mesh, P()))
        params = jax.device_put(params, shardings)
        return jitted(params, input_ids, attention_mask, pixel_values, grid_key(image_grid_thw))

    return call


def sharded_value_and_grad(loss_fn: Callable[..., Any], mesh: Mesh, shardings: Any,
                           *, has_aux: bool = False, donate_batch: bool = False) -> Callable[..., Any]:
    """Jitted `(loss[, aux]), grads = f(params, batch)` for the train step, gradients on the params' shardings.

    `loss_fn(params, batch)` returns a scalar (or `(scalar, aux)` with `has_aux`); `batch` is a pytree of
    arrays whose leading dimension is split over (`data`, `fsdp`) (see `data_shardings`). Static image
    layouts belong in `loss_fn`'s closure. The shardings of loss and aux are left to XLA's propagation
    (batch-shaped aux such as per-token log-probs stay batch-sharded; scalars are replicated).
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=has_aux)
    jitted = {}

    def call(params, batch):
        batch_shardings = data_shardings(batch, mesh)
        key = jax.tree_util.tree_structure(batch), tuple(np.shape(x) for x in jax.tree_util.tree_leaves(batch))
        if key not in jitted:
            jitted[key] = jax.jit(
                grad_fn,
                in_shardings=(shardings, batch_shardings),
                out_shardings=(None, shardings),
                donate_argnums=(1,) if donate_batch else (),
            )
        return jitted[key](jax.device_put(params, shardings), jax.device_put(batch, batch_shardings))

    return call


def _put(array: jax.Array, mesh: Mesh) -> jax.Array:
    return jax.device_put(array, data_shardings(array, mesh))
