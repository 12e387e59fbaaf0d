"""Device mesh over the axes (`data`, `fsdp`, `tensor`): the one place that knows the axis names.

- `data`: pure data parallelism (parameters replicated along it).
- `fsdp`: data parallelism whose parameters (and optimizer state) are sharded along it (ZeRO-3 style).
- `tensor`: Megatron-style tensor parallelism inside a layer (heads, MLP width, vocabulary).

The batch dimension of activations is sharded over (`data`, `fsdp`) together.

Config: a mapping (dict or ml_collections ConfigDict) with integer sizes for `data`, `fsdp`, `tensor`; at most
one of them may be -1 ("all the devices the others leave"). Multi-process jobs join with
`jaxwebrl.parallel.distributed.initialize`; their meshes keep `tensor` inside one host.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, PartitionSpec

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch dimension of activations is split over both


def resolve_mesh_shape(config: Mapping[str, Any] | None, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) sizes from `config`, with one -1 filled in; their product must be `num_devices`."""
    config = dict(config or {"data": -1})
    unknown = set(config) - set(AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}: the mesh axes are {AXES}")
    sizes = [int(config.get(axis, 1)) for axis in AXES]
    fill = [i for i, size in enumerate(sizes) if size == -1]
    if len(fill) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(AXES, sizes))}")
    if any(size == 0 or size < -1 for size in sizes):
        raise ValueError(f"mesh axis sizes must be positive (or -1 for 'the rest'), got {dict(zip(AXES, sizes))}")
    known = math.prod(size for size in sizes if size != -1)
    if fill:
        if num_devices % known:
            raise ValueError(
                f"mesh {dict(zip(AXES, sizes))}: {num_devices} devices are not divisible by the fixed axes' product {known}"
            )
        sizes[fill[0]] = num_devices // known
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices but {num_devices} are available: "
            "make the sizes multiply to the device count, or set one of them to -1"
        )
    return tuple(sizes)


def make_mesh(config: Mapping[str, Any] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` with axes (`data`, `fsdp`, `tensor`) over `devices` (default: every device of every process).

    Single process: devices are laid out by `mesh_utils.create_device_mesh` (topology-aware on TPU/GPU).
    Devices of several processes: `distributed.process_mesh` (hosts span `data`, then `fsdp`).
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(config, len(devices))
    if len({d.process_index for d in devices}) > 1:
        # hosts on `data`/`fsdp`, `tensor` inside a host; imported here to break a cycle (distributed imports mesh)
        from jaxwebrl.parallel.distributed import process_mesh

        return process_mesh(config, devices)
    try:
        grid = mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):  # no topology information: device order
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, AXES)


def batch_spec(ndim: int, batch_dim: int = 0) -> PartitionSpec:
    """PartitionSpec sharding dimension `batch_dim` of an `ndim`-array over (`data`, `fsdp`)."""
    spec: list[Any] = [None] * ndim
    spec[batch_dim] = BATCH_AXES
    return PartitionSpec(*spec)


def batch_divisor(mesh: Mesh | None) -> int:
    """Batch sizes must be multiples of this (the data × fsdp device count; 1 without a mesh)."""
    return 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]


def context_mesh(axes: Sequence[str] = AXES):
    """The (abstract) mesh in context (`jax.set_mesh`) when it has every one of `axes`, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty or not set(axes) <= set(mesh.axis_names) else mesh


def context_batch_divisor() -> int:
    """The (`data` × `fsdp`) device count of the mesh in context (`jax.set_mesh`); 1 when none is set."""
    mesh = context_mesh(BATCH_AXES)
    return 1 if mesh is None else math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def constrain_batch(x: jax.Array, batch_dim: int = 0) -> jax.Array:
    """x with dimension `batch_dim` split over (`data`, `fsdp`) when a mesh with those axes is in context
    (`jax.set_mesh`) and their size divides it; x unchanged otherwise (one device, no mesh set). A hint for
    activations XLA's sharding propagation would otherwise shard like the weights (replicating rows): a row count
    it does not divide runs whole on every chip of the batch axes (`assembly.row_bucket`'s `multiple` avoids it)."""
    size = context_batch_divisor()
    if size == 1 or x.shape[batch_dim] % size:
        return x
    return jax.lax.with_sharding_constraint(x, batch_spec(x.ndim, batch_dim))
