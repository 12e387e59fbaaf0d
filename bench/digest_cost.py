"""Seconds per MB of a checkpoint's digests on this machine's default JAX device: the device-side digest
(`jaxwebrl.checkpoint.digests.leaf_digests`, "fmix32-sum2") beside the CRC-32 (zlib) of the same bytes on the host
(the "crc32" digests hashed each shard so; on the CPU backend in place, with no copy to count). Prints one JSON.

    python3 bench/digest_cost.py [--mb 256] [--repeats 5]

A state of float32 leaves (an 8B-like mix of shapes, scaled to --mb); each digest is timed `repeats` times after one
warm-up call (the compile), best and median reported. The machine's load average is recorded: other work beside
the run slows both paths.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import zlib

import jax
import numpy as np

from jaxwebrl.checkpoint.digests import DIGEST_ALGORITHM, leaf_digests


def state(total_mb: float) -> dict:
    """Float32 leaves of about `total_mb` MB: a [V, D] embedding, [D, 3D] MLP-like and [D, D] attention-like
    matrices and a [D] norm, D = 1024."""
    d = 1024
    words = int(total_mb * 2**20 / 4)
    rng = np.random.default_rng(0)
    shapes = [(words // 4 // d, d), (d, words // 2 // d), (words // 4 // d, d), (d,)]
    return {f"leaf{i}": jax.device_put(rng.standard_normal(shape, dtype=np.float32)) for i, shape in enumerate(shapes)}


def timed(fn, repeats: int) -> list[float]:
    fn()   # warm-up: the compile (device digest), page faults (both)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=256.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tree = state(args.mb)
    host = {name: np.asarray(leaf) for name, leaf in tree.items()}
    mb = sum(leaf.nbytes for leaf in host.values()) / 2**20
    device = timed(lambda: leaf_digests(tree), args.repeats)
    crc32 = timed(lambda: [zlib.crc32(leaf.reshape(-1).view(np.uint8)) for leaf in host.values()], args.repeats)
    print(json.dumps({
        "what": "checkpoint digest cost per MB, device-side digest beside host CRC-32, same leaves",
        "backend": jax.default_backend(), "device": str(jax.devices()[0]), "mb": round(mb, 1),
        "algorithm": DIGEST_ALGORITHM, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "device_digest_ms_per_mb": {"best": 1e3 * min(device) / mb, "median": 1e3 * statistics.median(device) / mb},
        "crc32_ms_per_mb": {"best": 1e3 * min(crc32) / mb, "median": 1e3 * statistics.median(crc32) / mb},
        "seconds": {"device_digest": device, "crc32": crc32}}, indent=1))


if __name__ == "__main__":
    main()
