"""Repository-wide pytest setup.

Eight fake CPU devices so sharding tests exercise a real mesh; must be set before JAX is imported.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
