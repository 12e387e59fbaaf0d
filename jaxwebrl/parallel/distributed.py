"""Multi-controller JAX: join the job, build meshes that span processes, move host data to global arrays.

Every process of a multi-host job runs the same program (trainer + policy server); `initialize` makes them one
JAX runtime, after which `jax.devices()` lists every process's devices and jitted functions run SPMD over them.

    from jaxwebrl.parallel import distributed
    info = distributed.initialize(config.distributed)   # before any other JAX call; a no-op on one process
    mesh = distributed.process_mesh(config.mesh)          # (data, fsdp, tensor) over every process's devices
    batch = distributed.host_local_to_global(local_rows, mesh)   # each process feeds its own rows
    host = distributed.global_to_host(batch)                     # every process gets the whole array back

Settings come from a mapping (e.g. a ConfigDict section) and, where a key is unset, from the environment:

| key | environment | meaning |
|---|---|---|
| `coordinator_address` | `JAXWEBRL_COORDINATOR` | `host:port` of process 0's coordinator service |
| `num_processes` | `JAXWEBRL_NUM_PROCESSES` | processes in the job (1 or unset: single process, no-op) |
| `process_id` | `JAXWEBRL_PROCESS_ID` | this process's rank, 0..num_processes-1 |
| `local_device_ids` | `JAXWEBRL_LOCAL_DEVICE_IDS` | comma-separated accelerator ids this process owns (GPU) |
| `local_device_count` | `JAXWEBRL_LOCAL_DEVICE_COUNT` | CPU backend only: fake devices per process (tests) |
| `auto` | `JAXWEBRL_DISTRIBUTED_AUTO` | `true`: let JAX detect the cluster (TPU pod slice, SLURM, Open MPI) |

Cross-process collectives on CPU devices go through gloo (set before any backend starts).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxwebrl.parallel.mesh import AXES, batch_spec, make_mesh, resolve_mesh_shape

ENV = {
    "coordinator_address": "JAXWEBRL_COORDINATOR",
    "num_processes": "JAXWEBRL_NUM_PROCESSES",
    "process_id": "JAXWEBRL_PROCESS_ID",
    "local_device_ids": "JAXWEBRL_LOCAL_DEVICE_IDS",
    "local_device_count": "JAXWEBRL_LOCAL_DEVICE_COUNT",
    "auto": "JAXWEBRL_DISTRIBUTED_AUTO",
}


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """Resolved settings of one process (see the module docstring for each field)."""

    coordinator_address: str | None = None
    num_processes: int = 1
    process_id: int = 0
    local_device_ids: tuple[int, ...] | None = None
    local_device_count: int | None = None
    auto: bool = False

    @property
    def multi_process(self) -> bool:
        return self.auto or self.num_processes > 1


def resolve_settings(config: Mapping[str, Any] | None = None,
                     environ: Mapping[str, str] | None = None) -> DistributedSettings:
    """Settings from `config` (keys above; None values are unset) with the environment filling the gaps."""
    environ = os.environ if environ is None else environ
    config = dict(config or {})
    unknown = set(config) - set(ENV)
    if unknown:
        raise ValueError(f"unknown distributed setting(s) {sorted(unknown)}: the settings are {sorted(ENV)}")
    raw = {key: config.get(key) if config.get(key) is not None else environ.get(var) for key, var in ENV.items()}

    def integer(key):
        value = raw[key]
        if value is None or value == "":
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"distributed.{key}={value!r} (or ${ENV[key]}): must be an integer") from None

    num_processes = integer("num_processes")
    num_processes = 1 if num_processes is None else num_processes
    process_id = integer("process_id")
    ids = raw["local_device_ids"]
    if isinstance(ids, str):
        ids = [part for part in ids.split(",") if part.strip()]
    local_ids = tuple(int(i) for i in ids) if ids else None
    auto = str(raw["auto"]).lower() in ("1", "true", "yes") if raw["auto"] is not None else False
    settings = DistributedSettings(
        coordinator_address=raw["coordinator_address"] or None, num_processes=num_processes,
        process_id=0 if process_id is None else process_id, local_device_ids=local_ids,
        local_device_count=integer("local_device_count"), auto=auto)
    if num_processes < 1:
        raise ValueError(f"distributed.num_processes={num_processes}: must be >= 1")
    if settings.local_device_count is not None and settings.local_device_count < 1:
        raise ValueError(f"distributed.local_device_count={settings.local_device_count}: must be >= 1 (fake CPU "
                         f"devices a process)")
    if num_processes > 1 and not auto:
        if not settings.coordinator_address:
            raise ValueError(
                f"distributed.num_processes={num_processes} needs distributed.coordinator_address "
                f"(or ${ENV['coordinator_address']}), e.g. 10.0.0.1:12355 (process 0's host), or set "
                "distributed.auto=true on a TPU pod slice / SLURM cluster")
        if process_id is None:
            raise ValueError(f"distributed.num_processes={num_processes} needs distributed.process_id "
                             f"(or ${ENV['process_id']}): this process's rank in 0..{num_processes - 1}")
        if not 0 <= settings.process_id < num_processes:
            raise ValueError(f"distributed.process_id={settings.process_id} is outside 0..{num_processes - 1}")
    return settings


def initialize(config: Mapping[str, Any] | None = None, *, initialization_timeout_s: int = 300) -> DistributedSettings:
    """Join the multi-controller job the settings describe; call before any other JAX work.

    One process (num_processes 1/unset, auto false): only `local_device_count` applies (CPU), nothing else
    happens. Calling it again after a successful initialize is a no-op.
    """
    settings = resolve_settings(config)
    if settings.local_device_count is not None:
        jax.config.update("jax_num_cpu_devices", settings.local_device_count)
    if not settings.multi_process or jax.distributed.is_initialized():
        return settings
    # CPU devices need gloo for cross-process collectives; the setting touches only the CPU client (GPU/TPU
    # hosts keep NCCL/ICI), and it must be set before any backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if settings.auto:
        jax.distributed.initialize(initialization_timeout=initialization_timeout_s)
    else:
        jax.distributed.initialize(
            coordinator_address=settings.coordinator_address, num_processes=settings.num_processes,
            process_id=settings.process_id, local_device_ids=settings.local_device_ids,
            initialization_timeout=initialization_timeout_s)
    return settings


def shutdown() -> None:
    """Leave the job (all processes should call it at the end); a no-op when not initialized."""
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()


# ---------------------------------------------------------------------------------------------------------------
# Meshes


def process_mesh(config: Mapping[str, Any] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (`data`, `fsdp`, `tensor`) mesh over `devices` (default: every process's), whatever the platform.

    One process: `mesh.make_mesh`. Several: `data` then `fsdp` span the hosts and `tensor` stays on one host.
    A single TPU slice (all devices share one slice_index) is laid out topology-aware over all its hosts;
    several TPU slices split on slices (DCN); GPU/CPU hosts split on processes.
    """
    devices = list(jax.devices() if devices is None else devices)
    processes = sorted({d.process_index for d in devices})
    if len(processes) == 1:
        return make_mesh(config, devices)
    shape = resolve_mesh_shape(config, len(devices))
    slices = {getattr(d, "slice_index", None) for d in devices}
    platform = devices[0].platform
    if platform == "tpu" and len(slices) == 1:
        return Mesh(mesh_utils.create_device_mesh(shape, devices=devices, allow_split_physical_axes=True), AXES)
    granules = len(slices) if platform == "tpu" else len(processes)
    dcn = _outer_split(shape, granules)
    ici = tuple(s // d for s, d in zip(shape, dcn))
    try:
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices=devices, process_is_granule=platform != "tpu",
                                                    allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):  # CPU/GPU without topology: process-major order
        grid = _process_major_grid(devices, ici, dcn)
    return Mesh(grid, AXES)


def _outer_split(shape: tuple[int, int, int], granules: int) -> tuple[int, int, int]:
    """How many hosts (or slices) each axis spans: `data` first, then `fsdp`; `tensor` never crosses hosts."""
    remaining, dcn = granules, [1, 1, 1]
    for axis in (0, 1):
        factor = math.gcd(shape[axis], remaining)
        dcn[axis], remaining = factor, remaining // factor
    if remaining != 1:
        raise ValueError(
            f"mesh {dict(zip(AXES, shape))} cannot span {granules} hosts with `tensor` inside one host: make "
            "data × fsdp a multiple of the host count (e.g. --config.mesh.data=<hosts>)")
    return tuple(dcn)


def _process_major_grid(devices, ici, dcn) -> np.ndarray:
    by_process: dict[int, list] = {}
    for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    blocks = np.empty(dcn, dtype=object)
    for i, index in enumerate(np.ndindex(*dcn)):
        blocks[index] = np.asarray(list(by_process.values())[i], dtype=object).reshape(ici)
    return np.block(blocks.tolist())


def split_server_devices(num_server_devices: int, devices: Sequence[jax.Device] | None = None
                         ) -> tuple[list[jax.Device], list[jax.Device]]:
    """(trainer devices, policy-server devices): each process gives its last `num_server_devices` local devices
    to the server, so both meshes span every process and neither waits on the other's collectives."""
    devices = list(jax.devices() if devices is None else devices)
    by_process: dict[int, list] = {}
    for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    local = min(len(v) for v in by_process.values())
    if not 0 < num_server_devices < local:
        raise ValueError(f"num_server_devices={num_server_devices}: each process has {local} devices; give the "
                         f"policy server between 1 and {local - 1} of them (the rest train)")
    train = [d for v in by_process.values() for d in v[:len(v) - num_server_devices]]
    server = [d for v in by_process.values() for d in v[len(v) - num_server_devices:]]
    return train, server


def server_and_trainer_meshes(num_server_devices: int, train_mesh: Mapping[str, Any] | None = None,
                              server_mesh: Mapping[str, Any] | None = None) -> tuple[Mesh, Mesh]:
    """(trainer mesh, policy-server mesh) on disjoint devices (see `split_server_devices`)."""
    train, server = split_server_devices(num_server_devices)
    return process_mesh(train_mesh, train), process_mesh(server_mesh or {"data": -1}, server)


# ---------------------------------------------------------------------------------------------------------------
# Host data <-> global arrays


def host_local_to_global(tree: Any, mesh: Mesh, spec: PartitionSpec | None = None) -> Any:
    """Global arrays from each process's rows: process p's leaf `[b, ...]` becomes its slice of `[P·b, ...]`.

    Leading dimensions are split over (`data`, `fsdp`) unless `spec` says otherwise; every process must pass
    leaves of the same shape and dtype. With one process this is a sharded `device_put`.
    """
    def one(leaf):
        leaf = np.asarray(leaf)
        sharding = NamedSharding(mesh, spec if spec is not None else batch_spec(leaf.ndim) if leaf.ndim else PartitionSpec())
        return jax.make_array_from_process_local_data(sharding, leaf)

    return jax.tree.map(one, tree)


def replicate_from_host(tree: Any, mesh: Mesh) -> Any:
    """Global arrays replicated on every device of `mesh` from host values every process holds equally."""
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda leaf: jax.make_array_from_process_local_data(sharding, np.asarray(leaf)), tree)


def global_to_host(tree: Any) -> Any:
    """NumPy copies of (possibly non-addressable) global arrays, whole, on every process."""
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def whole_on_device(tree: Any, device: jax.Device | None) -> Any:
    """Whole copies of `tree`'s arrays on `device` (a policy server's, local to this process), or None where
    `device` is None (a process that keeps no copy). Each sharded array is gathered over its mesh on the devices (a
    jitted all-gather, one array at a time: over ICI/NVLink, never through host memory, which a plain `device_put`
    of a sharded array onto one device would read it back to) and this process's copy moved to `device`. When the
    arrays span several processes it is a collective: every process calls it at the same point."""
    copies = jax.tree.map(lambda leaf: _whole_on_device(leaf, device), tree)
    return None if device is None else copies


def _whole_on_device(array: jax.Array, device: jax.Device | None) -> jax.Array | None:
    if isinstance(array.sharding, NamedSharding) and not array.sharding.is_fully_replicated:
        array = _replicated_on(array.sharding.mesh)(array)
    if device is None:
        return None
    shards = array.addressable_shards
    return jax.device_put(next((s.data for s in shards if s.device == device), shards[0].data), device)


@functools.lru_cache(maxsize=None)
def _replicated_on(mesh: Mesh):
    """A jitted identity whose output is replicated over `mesh` (an all-gather on the devices)."""
    return jax.jit(lambda array: array, out_shardings=NamedSharding(mesh, PartitionSpec()))


def sync(name: str) -> None:
    """Barrier: every process waits here until all have reached `name` (a no-op on one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def all_processes(flag: bool) -> bool:
    """True when `flag` is true on every process (a collective: all must call it at the same point)."""
    return bool(np.all(_gather_flag(flag)))


def any_process(flag: bool) -> bool:
    """True when `flag` is true on some process (a collective, like `all_processes`)."""
    return bool(np.any(_gather_flag(flag)))


def _gather_flag(flag: bool) -> np.ndarray:
    """[num_processes] int32: every process's `flag` (no communication on one process)."""
    if jax.process_count() == 1:
        return np.asarray([bool(flag)], np.int32)
    return np.asarray(multihost_utils.process_allgather(np.asarray(bool(flag), np.int32)))


def broadcast_ints(values: Sequence[int] | None) -> list[int]:
    """Process 0's `values` (int32 range) on every process; the others pass None (no communication on one
    process)."""
    if jax.process_count() == 1:
        return [int(v) for v in values]
    count = int(multihost_utils.broadcast_one_to_all(np.asarray(len(values) if is_primary() else 0, np.int32)))
    mine = np.asarray(values if is_primary() else np.zeros(count), np.int32)
    return [int(v) for v in np.asarray(multihost_utils.broadcast_one_to_all(mine))]


def is_primary() -> bool:
    """True on the process that writes logs, metrics and JSON side files (process 0)."""
    return jax.process_index() == 0


def shard_from_host(tree: Any, shardings: Any) -> Any:
    """Global arrays on `shardings` (a matching pytree) from host values every process holds equally (e.g. the
    same seed's init or a checkpoint read on each host): each process materialises only its own shards."""
    def one(leaf, sharding):
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)


def placed(tree: Any, shardings: Any) -> Any:
    """New arrays of `tree`'s values on `shardings` (a matching pytree), never aliasing `tree` (a trainer's update
    donates them). Device arrays go device to device, each device receiving only its shard (no host copy, no second
    whole copy): arrays this process holds whole, for shardings over its own devices (one process), and global
    arrays already spread over several processes (a recipe built on the mesh: every process calls this). Other
    leaves: host values every process holds equally (`shard_from_host`)."""
    def one(leaf, sharding):
        if isinstance(leaf, jax.Array) and (not leaf.is_fully_addressable or sharding.is_fully_addressable):
            return jax.device_put(leaf, sharding, may_alias=False)
        return shard_from_host(leaf, sharding)

    return jax.tree.map(one, tree, shardings)


def replicated_key(key: jax.Array, mesh: Mesh) -> jax.Array:
    """A typed PRNG key as a global array replicated over `mesh`, so Orbax can save it from every process
    (a key made by `jax.random.key` lives on one local device, which multi-host checkpointing refuses)."""
    data = replicate_from_host(np.asarray(jax.random.key_data(key)), mesh)
    return jax.random.wrap_key_data(data, impl=jax.random.key_impl(key))
