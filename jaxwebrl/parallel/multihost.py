"""The trainer's side of a multi-controller job: which devices train, where the policy server decodes, and the
small agreements that keep every process's trainer loop in lockstep.

`launch/train.py` runs once per process with the same flags. `config.distributed` (or the JAXWEBRL_* environment,
see `distributed.py`) joins the processes; then every process builds the same trainer on one mesh that spans
them all, reads the same episodes from the shared buffer and runs the same update. Process 0 alone runs the
policy server, the rollout worker pool and the metrics writer.

    layout = multihost.layout(config)          # after distributed.initialize
    layout.mesh          # trainer Mesh (data, fsdp, tensor) over every process, or None (plain one-device run)
    layout.server_device # the local device process 0's policy server decodes on

The policy server is request-driven on one process, so it cannot take part in SPMD programs over other hosts'
devices. It gets a whole copy of the weights instead: after each update every process calls
`MeshWeightSink.set_weights` (an all-gather of the sharded params on the devices, one array at a time,
`distributed.whole_on_device`: ICI/NVLink, no host memory), and process 0 moves its copy to its server on
`server_device`; the other processes drop theirs. With `distributed.server_devices = k`, each process keeps its
last k local devices out of the trainer mesh (`distributed.split_server_devices`), and process 0's server
decodes on the first of its own; with 0 the server shares local device 0 with the trainer (as on one host).

Lockstep: `LockstepBuffer` gives every process the episodes process 0 read, `distributed.all_processes` /
`any_process` agree on "batch ready" and "stop", and `NullMetrics` keeps the other processes from writing files.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from typing import Any, Callable, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from jaxwebrl.parallel import distributed
from jaxwebrl.parallel.mesh import AXES
from jaxwebrl.parallel.partition import param_shardings

LAYOUT_KEYS = ("mesh", "server_devices")   # config.distributed keys that are not initialize()'s


def initialize_settings(section: Mapping[str, Any] | None) -> dict:
    """The part of `config.distributed` that `distributed.initialize` takes (the join settings)."""
    section = dict(section or {})
    return {k: v for k, v in section.items() if k not in LAYOUT_KEYS}


def mesh_sizes(section: Mapping[str, Any] | None, num_processes: int) -> dict | None:
    """The trainer mesh sizes `config.distributed.mesh` asks for, or None for the plain one-device trainer.

    Several processes always use a mesh: `data` defaults to the process count (data parallel across hosts) and
    `fsdp` to -1 (the devices left, sharding params and optimizer state inside a host). One process uses a mesh
    only when some axis is set (e.g. `--config.distributed.mesh.fsdp=-1`).
    """
    given = {axis: int(v) for axis, v in dict(dict(section or {}).get("mesh") or {}).items() if v is not None}
    unknown = set(given) - set(AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes distributed.mesh.{sorted(unknown)}: the axes are {AXES}")
    if num_processes == 1 and not given:
        return None
    sizes = dict(given)
    if -1 not in sizes.values() and "data" not in sizes:
        sizes["data"] = num_processes
    if -1 not in sizes.values():
        sizes.setdefault("fsdp", -1)
    sizes.setdefault("tensor", 1)
    sizes.setdefault("fsdp", 1)
    sizes.setdefault("data", 1)
    return {axis: sizes[axis] for axis in AXES}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the trainer and the policy server run (see the module docstring)."""

    mesh: Mesh | None
    server_device: jax.Device


def layout(config) -> Layout:
    """The trainer mesh and the server's device for this process, from `config.distributed` (call after
    `distributed.initialize`)."""
    section = config.get("distributed") if hasattr(config, "get") else None
    section = dict(section or {})
    sizes = mesh_sizes(section, jax.process_count())
    reserved = int(section.get("server_devices") or 0)
    if sizes is None:
        if reserved:
            raise ValueError(f"distributed.server_devices={reserved} needs a trainer mesh: set "
                             "distributed.mesh (e.g. --config.distributed.mesh.fsdp=-1) or run several processes")
        return Layout(None, jax.local_devices()[0])
    if reserved:
        train, server = distributed.split_server_devices(reserved)
        local_server = [d for d in server if d.process_index == jax.process_index()]
        return Layout(distributed.process_mesh(sizes, train), local_server[0])
    return Layout(distributed.process_mesh(sizes), jax.local_devices()[0])


def place_train_state(params, rng: jax.Array, mesh: Mesh):
    """(copies of params sharded on `mesh` by the partition rules, `rng` replicated on it): global arrays that every
    process's jitted update and Orbax save can use (`distributed.placed`: device to device on one process). Every
    process passes the same values (same seed)."""
    params = distributed.placed(params, param_shardings(params, mesh))
    return params, distributed.replicated_key(rng, mesh)


class MeshWeightSink:
    """The trainer's weight sink when params live on a mesh: process 0 hands a whole copy on `device` to its policy
    server (`server`; None on the other processes). Every process calls `set_weights` at the same point: the params
    are gathered on the mesh's devices (a collective when they span processes), never through host memory."""

    def __init__(self, server, device: jax.Device):
        self.server = server
        self.device = device

    def set_weights(self, params, version: int) -> None:
        copy = distributed.whole_on_device(params, self.device if self.server is not None else None)
        if self.server is not None:
            self.server.set_weights(copy, version)

    def pause(self) -> None:
        if self.server is not None and hasattr(self.server, "pause"):
            self.server.pause()

    def resume(self) -> None:
        if self.server is not None and hasattr(self.server, "resume"):
            self.server.resume()


class LockstepBuffer:
    """The ring buffer as every process of a multi-controller trainer reads it (everything but `read` is the
    buffer's own).

    Process 0 reads what is there. Every other process then reads the same log range from the same cursor, up to
    process 0's end of the log, so it gets the same episodes and the same cursor. Whether a group is complete or
    given up as incomplete depends on how far the log has been read, so reading "whatever is there now" could
    give two processes different batches, hence different shapes, and their collectives would hang. Whether a
    partial group's writer may still complete it is process 0's call alone, sent with the range (the log seqs it
    holds back): each process asking itself (a pid check on one host, its own clock against the writer's lease on
    another) gave a group up on one process and handed it to a step on another. A process that still sees fewer
    records (a shared filesystem's lag) re-reads from the same cursor. Then the episode ids and the held-back seqs
    are compared (counts and CRC32): a difference (the ring overwrote them under a lagging reader) fails every
    process with a clear error instead of hanging.

    `read` is a collective: every process calls it at the same point (the trainer's poll loop is in lockstep).
    """

    def __init__(self, buffer, *, primary: bool | None = None, broadcast: Callable | None = None,
                 agree_any: Callable[[bool], bool] | None = None, timeout_s: float = 120.0, retry_s: float = 0.05):
        self._buffer = buffer
        self._primary = distributed.is_primary() if primary is None else primary
        self._broadcast = broadcast or multihost_utils.broadcast_one_to_all
        self._agree_any = agree_any or distributed.any_process
        self._timeout_s, self._retry_s = timeout_s, retry_s

    def __getattr__(self, name):
        return getattr(self._buffer, name)

    def read(self, since=None, *, group_size: int | None = None, **options):
        if self._primary:
            cursor = self._buffer.oldest_cursor() if since is None else since   # what read(None) starts from
            result = self._buffer.read(cursor, group_size=group_size, **options)
            held = result.cursor["pending"]
            self._broadcast(_header(_next(cursor), result.cursor["next"], result.episodes, len(held)))
            if held:
                self._broadcast(np.asarray([limb for seq in held for limb in _limbs(seq)], np.int32))
            same, detail = True, ""
        else:
            start, end, count, digest, n_held = _unpack(self._broadcast(np.zeros(HEADER, np.int32)))
            held = _unpack_seqs(self._broadcast(np.zeros(2 * n_held, np.int32))) if n_held else []
            cursor = {"next": start, "pending": []} if since is None else since
            result = self._read_up_to(cursor, end, group_size, dict(options, held_back=set(held)))
            ids = _episode_ids(result.episodes)
            same = ((_next(cursor), result.cursor["next"], len(ids), _crc(ids), result.cursor["pending"])
                    == (start, end, count, digest, held))
            detail = (f": process {jax.process_index()} read log {_next(cursor)}..{result.cursor['next']}, "
                      f"{len(ids)} episodes, held back {len(result.cursor['pending'])}; process 0 read "
                      f"{start}..{end}, {count} episodes, held back {n_held}")
        if self._agree_any(not same):   # every process fails together rather than hang in a later collective
            raise RuntimeError(
                "the trainer processes read different episodes from the ring buffer" + detail + ". The ring "
                "overwrote them under a lagging reader, or buffer.path is not the same shared path on every host: "
                "raise buffer.capacity_steps, or give every process the same buffer.path")
        return result

    def _read_up_to(self, cursor, end: int, group_size, options):
        """One read from `cursor` through log seq `end` (re-read while this process sees fewer records)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            result = self._buffer.read(cursor, group_size=group_size,
                                       **dict(options, max_episodes=max(0, end - _next(cursor))))
            if result.cursor["next"] >= end or time.monotonic() > deadline:
                return result
            time.sleep(self._retry_s)   # process 0 saw commits this process cannot see yet


HEADER = 8   # int32: start (2 limbs), end (2 limbs), episode count, CRC32 of the ids (2 limbs), held-back count


def _limbs(value: int) -> list[int]:
    return [int(value) >> 31, int(value) & 0x7FFFFFFF]


def _header(start: int, end: int, episodes: list, held: int) -> np.ndarray:
    ids = _episode_ids(episodes)
    return np.asarray(_limbs(start) + _limbs(end) + [len(ids)] + _limbs(_crc(ids)) + [held], np.int32)


def _unpack(header) -> tuple[int, int, int, int, int]:
    h = [int(v) for v in np.asarray(header)]
    return (h[0] << 31) + h[1], (h[2] << 31) + h[3], h[4], (h[5] << 31) + h[6], h[7]


def _unpack_seqs(limbs) -> list[int]:
    """Log seqs from their (high, low) int32 limbs, in order."""
    v = [int(x) for x in np.asarray(limbs)]
    return [(hi << 31) + lo for hi, lo in zip(v[0::2], v[1::2])]


def _episode_ids(episodes: list) -> np.ndarray:
    return np.asarray([e.episode_id for e in episodes], np.int64)


def _crc(ids: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(ids, np.int64).tobytes())


def _next(cursor) -> int:
    return int(cursor["next"]) if isinstance(cursor, dict) else int(cursor)


class NullMetrics:
    """The metrics writer of processes other than 0: they train the same steps but write no files (takes
    MetricsWriter's arguments and ignores them)."""

    def __init__(self, *args, **kwargs):
        pass

    def write(self, step, scalars, histograms=None) -> None:
        pass

    def write_episodes(self, step, episode_ids) -> None:
        pass

    def write_skipped(self, step, episode_ids, reason) -> None:
        pass

    def write_stopped(self, step, counts, reason) -> None:
        pass

    def write_samples(self, step, episodes, fetch_image, count) -> None:
        pass

    def close(self) -> None:
        pass
