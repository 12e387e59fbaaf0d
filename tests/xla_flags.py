"""The suite's XLA flags: eight fake CPU devices (sharding tests see a real mesh), and XLA:CPU's LLVM backend at
optimisation level 0, because the suite compiles far more than it runs.

Measured side by side from cold caches (docs/results/house/xla_opt_level_ab.json): level 0 compiled the tiny
default's train step in 6.9 s against 14.2 s and ran it in 2.9-3.1 s against 1.5-1.8 s; five slow test files took
722 test-seconds against 1,133, but for the GRPO toy learning run, 702 s against 311 s. So the learning runs and the
real-width rehearsal launch their runs at the default level (`run_speed_flags`, `run_speed_env`).
"""

from __future__ import annotations

import os

QUICK_COMPILE = "--xla_backend_optimization_level=0"


def suite_flags(devices: int = 8) -> str:
    """XLA_FLAGS for the suite's processes: `devices` fake CPU devices, compiled at optimisation level 0."""
    return f"--xla_force_host_platform_device_count={devices} {QUICK_COMPILE}"


def run_speed_flags() -> str:
    """This process's XLA_FLAGS without the level-0 flag, for a run that runs more than it compiles (a learning
    run): XLA:CPU then optimises its programs as a user's run does."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != QUICK_COMPILE)


def run_speed_env() -> dict[str, str]:
    """This process's environment with `run_speed_flags()`, for a learning run's subprocess."""
    return {**os.environ, "XLA_FLAGS": run_speed_flags()}
