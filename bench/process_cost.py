"""What a fresh process pays before it does its work, for two or more trees side by side: the suite starts hundreds
of launch, rollout-worker and bench processes, and each pays its imports and its first traces again.

    python3 bench/process_cost.py --arm=before:/tmp/wt-before:/tmp/ml_dtypes_070 --arm=after:$PWD --runs=5

An arm is NAME:PYTHONPATH (a tree first; more entries after it, e.g. a directory holding another ml_dtypes, come
before the site-packages). Each round runs every workload once in each arm, arms alternating, each in a fresh
process with the compilation cache off; a process's cost is its CPU seconds (user + system). Workloads:

    launch_imports   what launch/train.py imports before its first step (bench/bytecode_cost.py's IMPORTS)
    worker_imports   a rollout worker process's module (jaxwebrl.rollout.worker_process)
    tensorboard      the metrics writer a run opens (metrics.tensorboard on, the default), after the launch imports
    first_digest     the tiny default's params and AdamW state digested once (every checkpoint save), after the
                     launch imports and the policy's build

Prints JSON: each workload's CPU seconds per arm (every run and the median) and each arm's median minus the first's.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys

from absl import app, flags
from bytecode_cost import IMPORTS

WORKLOADS = {
    "launch_imports": IMPORTS,
    "worker_imports": "import jaxwebrl.rollout.worker_process",
    "tensorboard": IMPORTS + "; import tempfile; from jaxwebrl.train.metrics import MetricsWriter; "
                   "MetricsWriter(tempfile.mkdtemp(), total_steps=1, progress_bar=False).close()",
    "first_digest": IMPORTS + "; import optax; from jaxwebrl.models.presets import build_policy; "
                    "from jaxwebrl.checkpoint.digests import leaf_digests; p = build_policy({'name': 'tiny'}, seed=0); "
                    "leaf_digests({'params': p.params, 'opt': optax.adamw(1e-3).init(p.params)})",
}

_ARMS = flags.DEFINE_multi_string("arm", None, "NAME:PYTHONPATH, two or more", required=True)
_RUNS = flags.DEFINE_integer("runs", 5, "runs of every workload in every arm")


def run_in(pythonpath: str, code: str, **env) -> None:
    """A fresh `python3 -c code` in the arm's tree (its first PYTHONPATH entry, which `-c` puts first on the path)."""
    subprocess.run([sys.executable, "-c", code], cwd=pythonpath.split(":")[0], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": pythonpath, **env})


def process_cpu_s(code: str, pythonpath: str) -> float:
    """CPU seconds (user + system) of one fresh `python3 -c code` in an arm, the compilation cache off."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run_in(pythonpath, code, JAX_ENABLE_COMPILATION_CACHE="false")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2)


def main(argv) -> None:
    del argv
    arms = dict(arm.split(":", 1) for arm in _ARMS.value)
    for path in arms.values():   # each arm's .pyc files are written before anything is timed
        run_in(path, WORKLOADS["first_digest"] + "; import jaxwebrl.rollout.worker_process")
    runs = {work: {name: [] for name in arms} for work in WORKLOADS}
    for _ in range(_RUNS.value):
        for work, code in WORKLOADS.items():
            for name, path in arms.items():
                runs[work][name].append(process_cpu_s(code, path))
    first = next(iter(arms))
    report = {"arms": arms, "runs": _RUNS.value, "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "load_average": os.getloadavg(), "cpu_s": runs,
              "median_cpu_s": {w: {n: statistics.median(v) for n, v in r.items()} for w, r in runs.items()}}
    report["median_minus_" + first] = {w: {n: round(m[n] - m[first], 2) for n in arms if n != first}
                                       for w, m in report["median_cpu_s"].items()}
    print(json.dumps(report))


if __name__ == "__main__":
    app.run(main)
