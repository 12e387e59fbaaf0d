"""bench/ scripts import each other by module name (they run as `python bench/x.py`): put bench/ on sys.path.
`run_bench`: a bench script run for real in a subprocess, its printed JSON parsed. Its time limit only catches a
hang: at the smallest sizes a bench takes seconds to minutes alone, and the flake hunt (beside a CPU hog and other
test runs) saw bench/update_ab.py pass 300 s, so the default is 900 s."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from bench_json import last_json  # noqa: E402  (bench/ is on sys.path from here)


@pytest.fixture
def run_bench():
    def run(name: str, *args: str, timeout: float = 900) -> dict:
        done = subprocess.run([sys.executable, os.path.join(BENCH, name), *args], cwd=REPO, capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"})
        assert done.returncode == 0, done.stderr[-3000:]
        return last_json(done.stdout)
    return run
