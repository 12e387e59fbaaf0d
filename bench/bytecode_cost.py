"""What a Python process pays to import what a launch imports when no byte-code is cached: CI's environment sets
PYTHONDONTWRITEBYTECODE=1 and `.ci/install` installs with `pip --no-compile`, so unless `.ci/run`/`.ci/test` let
the first process write its .pyc files, every process the suite starts compiles them again.

    python3 bench/bytecode_cost.py --repeats=3

Each repeat runs the import in a fresh process twice, side by side in time: once reading the cached .pyc files
and once compiling from source (`-X pycache_prefix=<empty dir>` with PYTHONDONTWRITEBYTECODE=1: nothing is read
or written), and records each process's CPU seconds. Prints JSON.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what launch/train.py imports before its first step: JAX and the libraries, then the trainer and the rollout side
IMPORTS = ("import jax, jax.numpy as jnp, flax.linen, optax, orbax.checkpoint, tensorstore; jnp.ones(2); "
           "import jaxwebrl.train.supervisor, jaxwebrl.eval.probe, jaxwebrl.cli")

_REPEATS = flags.DEFINE_integer("repeats", 3, "pairs of fresh processes (cached, from source)")


def import_cpu_s(*python_args: str) -> float:
    """CPU seconds (user + system) of one fresh `python3 *python_args -c IMPORTS` in the repo."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *python_args, "-c", IMPORTS], cwd=REPO, check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": REPO})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2)


def main(argv) -> None:
    del argv
    # the cached arm needs .pyc files for everything it imports: one process writes them first
    subprocess.run([sys.executable, "-c", IMPORTS], cwd=REPO, check=True,
                   env={k: v for k, v in {**os.environ, "PYTHONPATH": REPO}.items() if k != "PYTHONDONTWRITEBYTECODE"})
    cached, source = [], []
    for _ in range(_REPEATS.value):
        cached.append(import_cpu_s())
        with tempfile.TemporaryDirectory() as empty:
            source.append(import_cpu_s("-X", f"pycache_prefix={empty}"))
    print(json.dumps({"imports": IMPORTS, "cached_cpu_s": cached, "source_cpu_s": source,
                      "extra_cpu_s_per_process": round(sum(source) / len(source) - sum(cached) / len(cached), 2)}))


if __name__ == "__main__":
    app.run(main)
