"""Suite-wide settings that make the two-worker pass (`.ci/test`) shorter without changing what any test checks.

- The pytest processes keep compiled programs in the persistent XLA cache (`jaxwebrl.parallel.compile_cache`), as
  the launcher processes the tests start already do by default (`compilation_cache_dir`): a program that several
  test files compile (the tiny policy's sampler and update, the toy's) is compiled once per run, not once per file.
  `JAXWEBRL_TEST_XLA_CACHE=''` turns it off; a fresh directory there measures a cold run.
- The slowest files are scheduled first: `-n 2 --dist loadfile` hands files to whichever worker is free in
  collection order, so a four-minute file collected last leaves the other worker idle for those four minutes.
"""

from __future__ import annotations

import os

from configs.base import FIELDS
from jaxwebrl.parallel import compile_cache

compile_cache.enable(os.environ.get("JAXWEBRL_TEST_XLA_CACHE", FIELDS["compilation_cache_dir"].default))

# The slowest files of `bash .ci/test` (seconds summed over their tests in the two-worker pass from a cold XLA cache,
# as in CI: docs/results/house/suite_profile_cold_08323f3.json, 6 Dec 2026, alone), slowest first, but for the two
# learning runs whose length varies most, first of all: the LoRA run (one or two seeds, 16 updates at most each)
# and the critic PPO run (to GOAL_READ in 9 updates, 24 at most), so that neither is the last file running. A file
# not listed keeps its collection order after these; a listed file that is gone is ignored.
# tests/rollout/test_vllm_engine.py (223 s) is left out on purpose: its tests wait for .ci/install-vllm, which runs
# beside .ci/install and, where the download is slow, the start of the suite in .ci/run.
SLOWEST_FIRST = (
    "tests/launch/test_toy_learns_lora.py",      # 269 s
    "tests/launch/test_toy_learns_ppo.py",       # 330 s to all four; 145 s alone to GOAL_READ
    "tests/train/test_critic.py",                # 349 s
    "tests/parallel/test_compile.py",            # 270 s: XLA's TPU compiler
    "tests/bench/test_bench_smoke.py",           # 220 s
    "tests/env/test_sites.py",                   # 215 s: the webgym recipe twice (ground truth, its engine)
    "tests/bench/test_bench_smoke_live.py",      # 195 s
    "tests/scale/test_launch_multihost.py",      # 191 s
    "tests/launch/test_train_run.py",            # 150 s
    "tests/bench/test_learning_run.py",          # 147 s
    "tests/launch/test_toy_learns.py",           # 135 s
    "tests/models/test_remat_policies.py",       # 124 s
    "tests/train/test_lora.py",                  # 122 s
    "tests/launch/test_train_kl.py",             # 121 s
    "tests/train/test_update_layout.py",         # 110 s
    "tests/env/test_chain.py",                   # 108 s
    "tests/models/test_scan_layers.py",          # 107 s
    "tests/train/test_update.py",                # 106 s
    "tests/train/test_reference.py",             # 104 s
    "tests/test_mutations.py",                   # 102 s
    "tests/train/test_trainer.py",               # 101 s
    "tests/launch/test_console.py",              # 99 s
)


def pytest_collection_modifyitems(config, items):
    """Items of the SLOWEST_FIRST files first (in that order), the rest after in collection order (a stable sort)."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    root = str(config.rootpath)

    def key(item):
        path = os.path.relpath(str(item.path), root)
        return rank.get(path, len(SLOWEST_FIRST))

    items.sort(key=key)


_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Seconds per test file (setup, call and teardown of its tests; under xdist the controller sees every report)."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The 30 slowest files in three lines, right above the result line: what to schedule first (SLOWEST_FIRST)
    and what to make shorter, readable in the tail of a CI log."""
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:30]
    if not slowest:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_line(f"test seconds by file ({total:.0f} s in {len(_FILE_SECONDS)} files), slowest first:")
    for start in range(0, len(slowest), 10):
        terminalreporter.write_line("  " + ", ".join(f"{path.removeprefix('tests/')} {seconds:.0f}"
                                                     for path, seconds in slowest[start:start + 10]))
