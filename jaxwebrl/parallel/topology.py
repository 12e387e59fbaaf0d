"""Accelerator slices without the hardware: published chip numbers and compile-only TPU devices.

`CHIPS` holds each chip's published dense bf16 peak, HBM capacity and HBM bandwidth (vendor datasheets; capacity
in decimal GB, a little under the GiB the chips report, so a "fits" here is conservative). `topology_devices(name)`
gives the compile-only devices of a TPU slice (`jax.experimental.topologies.get_topology_desc`, which needs
libtpu from PyPI: `pip install -e ".[tpu]"`), so XLA compiles and sizes the real programs for that slice on any
machine. Names follow Cloud TPU: v5e-N / v6e-N have N chips; v5p-N has N TensorCores, N/2 chips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    peak_bf16_flops: float        # dense bf16 FLOP/s per chip
    hbm_bytes: float              # HBM per chip
    hbm_bandwidth: float          # bytes/s per chip


CHIPS = {
    "v5e": Chip("TPU v5e", 197e12, 16e9, 819e9),
    "v5p": Chip("TPU v5p", 459e12, 95e9, 2765e9),
    "v6e": Chip("TPU v6e", 918e12, 32e9, 1640e9),
    "h100": Chip("NVIDIA H100 SXM", 989e12, 80e9, 3.35e12),
    "h200": Chip("NVIDIA H200 SXM", 989e12, 141e9, 4.8e12),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str                     # e.g. "v5p-8"
    chip: str                     # key of CHIPS
    desc: str                     # get_topology_desc name, e.g. "v5p:2x2x1"
    chips_per_host: tuple[int, int, int] | None = None

    @property
    def num_chips(self) -> int:
        n = 1
        for d in self.desc.split(":")[1].split("x"):
            n *= int(d)
        return n


TOPOLOGIES = {t.name: t for t in (
    Topology("v5e-4", "v5e", "v5e:2x2", (2, 2, 1)),
    Topology("v5e-8", "v5e", "v5e:2x4", (2, 4, 1)),
    Topology("v5e-16", "v5e", "v5e:4x4", (2, 4, 1)),
    Topology("v5p-8", "v5p", "v5p:2x2x1"),
    Topology("v5p-16", "v5p", "v5p:2x2x2"),
    Topology("v5p-32", "v5p", "v5p:2x2x4"),
    Topology("v6e-4", "v6e", "v6e:2x2", (2, 2, 1)),
    Topology("v6e-8", "v6e", "v6e:2x4", (2, 4, 1)),
    Topology("v6e-16", "v6e", "v6e:4x4", (2, 4, 1)),
)}


LIBTPU_MISSING = 'libtpu is not installed: pip install -e ".[tpu]" (AOT compilation for TPU topologies)'


def libtpu_available() -> bool:
    """Whether JAX can load the TPU plugin (libtpu from PyPI, or TPU_LIBRARY_PATH)."""
    from jax._src.cloud_tpu_init import get_tpu_library_path  # deferred: TPU plugin lookup, only when asked

    return get_tpu_library_path() is not None


class TopologyError(RuntimeError):
    """An unknown topology or a missing libtpu: the message is one line that names the fix."""


def lookup(name: str) -> Topology:
    if name not in TOPOLOGIES:
        raise TopologyError(f"unknown topology {name!r}: use one of {', '.join(TOPOLOGIES)}")
    return TOPOLOGIES[name]


@contextlib.contextmanager
def _quiet_stderr():
    """libtpu prints start-up warnings on fd 2 when it finds no TPU; keep them unless something fails."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield sink
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def topology_devices(name: str) -> tuple[list, Topology]:
    """(compile-only devices of slice `name`, its Topology); TopologyError in one line when it cannot be made."""
    topology = lookup(name)
    if not libtpu_available():
        raise TopologyError(LIBTPU_MISSING)
    from jax.experimental import topologies  # deferred: loads libtpu (heavy, optional: the tpu extra)

    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")   # no metadata server here: one hostname
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")     # compile-only: several processes may load libtpu
    kwargs = {} if topology.chips_per_host is None else {"chips_per_host_bounds": topology.chips_per_host}
    with _quiet_stderr() as sink:
        try:
            desc = topologies.get_topology_desc(topology.desc, "tpu", **kwargs)
        except RuntimeError as err:
            sink.seek(0)
            if "TPU support not installed" in str(err):
                raise TopologyError(LIBTPU_MISSING) from None
            raise TopologyError(f"cannot make topology {name} ({topology.desc}): {str(err).splitlines()[0]}") from err
    return list(desc.devices), topology
