"""Repository-wide pytest setup.

Eight fake CPU devices so sharding tests exercise a real mesh, compiled for a quick compile (LLVM at level 0, the
classic loop emitters: `tests/xla_flags.py`); must be set before JAX is imported.
"""

import gc
import os
import sys

import pytest

from tests.xla_flags import suite_flags

os.environ.setdefault("XLA_FLAGS", suite_flags())
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


MAX_MAP_COUNT_FILE = "/proc/sys/vm/max_map_count"


def memory_map_count() -> int | None:
    """How many memory mappings this process holds (Linux), or None where /proc is not there."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


@pytest.fixture(autouse=True, scope="module")
def free_compiled_programs():
    """Drops every compiled XLA program after each test module.

    Each CPU executable holds ~3 memory mappings while any cache keeps it; over the whole suite they passed
    vm.max_map_count (65,530) near test 1,080 and the process died in mmap (SIGABRT/SIGSEGV in CI, never alone).
    A module that finishes with its mappings still past half the limit fails here, naming the leak."""
    yield
    jax = sys.modules.get("jax")
    gc.collect()
    if jax is not None:
        jax.clear_caches()
    gc.collect()
    count = memory_map_count()
    try:
        with open(MAX_MAP_COUNT_FILE) as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return
    if count is not None and count > limit // 2:
        pytest.fail(f"this test module left {count:,} memory mappings (vm.max_map_count is {limit:,}) after "
                    f"jax.clear_caches(): something outside JAX's caches keeps compiled programs alive (a "
                    f"module-level jit, a cached Policy); the suite dies in mmap once it passes the limit")


def pytest_addoption(parser):
    parser.addoption("--cpu-hog", type=int, default=0, metavar="N",
                     help="run N busy-looping processes for the whole session (tests/cpu_hog.py): races that a "
                          "loaded CI machine shows show here too")


def pytest_configure(config):
    n = config.getoption("--cpu-hog")
    if n:
        from tests.cpu_hog import cpu_hog  # here, not at the top: only a session that asks for a hog loads it

        config._cpu_hog = cpu_hog(n)
        config._cpu_hog.__enter__()


def pytest_unconfigure(config):
    hog = getattr(config, "_cpu_hog", None)
    if hog is not None:
        hog.__exit__(None, None, None)
