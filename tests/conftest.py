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
# as in CI: docs/results/house/suite_profile_cold_646a66f.json, 7 Dec 2026, alone), slowest first, but for the two
# learning runs whose length varies most, first of all: the LoRA run (one or two seeds, 16 updates at most each)
# and the critic PPO run (to GOAL_READ in 9 updates, 24 at most), so that neither is the last file running. A file
# not listed keeps its collection order after these; a listed file that is gone is ignored.
# tests/rollout/test_vllm_engine.py (218 s) is left out on purpose: its tests wait for .ci/install-vllm, which runs
# beside .ci/install and, where the download is slow, the start of the suite in .ci/run.
SLOWEST_FIRST = (
    "tests/launch/test_toy_learns_lora.py",      # 283 s
    "tests/launch/test_toy_learns_ppo.py",       # 329 s (to GOAL_READ; 145 s alone)
    "tests/bench/test_bench_smoke_live.py",      # 266 s
    "tests/parallel/test_compile.py",            # 241 s: XLA's TPU compiler
    "tests/bench/test_bench_smoke.py",           # 208 s
    "tests/train/test_critic.py",                # 197 s
    "tests/env/test_sites.py",                   # 192 s: the webgym recipe twice (ground truth, its engine)
    "tests/bench/test_learning_run.py",          # 184 s
    "tests/scale/test_launch_multihost.py",      # 165 s
    "tests/launch/test_toy_learns.py",           # 147 s
    "tests/launch/test_train_run.py",            # 134 s
    "tests/test_mutations.py",                   # 132 s
    "tests/env/test_chain.py",                   # 114 s
    "tests/train/test_update.py",                # 106 s
    "tests/models/test_remat_policies.py",       # 105 s
    "tests/train/test_lora.py",                  # 98 s
    "tests/eval/test_evaluate_policy.py",        # 87 s
    "tests/models/test_attention.py",            # 86 s
    "tests/launch/test_console.py",              # 81 s
    "tests/train/test_reference.py",             # 80 s
    "tests/train/test_update_layout.py",         # 80 s
    "tests/plan/test_plan_command.py",           # 79 s
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
