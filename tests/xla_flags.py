"""The suite's XLA flags: eight fake CPU devices (sharding tests see a real mesh), and XLA:CPU compiling for speed
of compilation, because the suite compiles far more than it runs: LLVM at optimisation level 0, and the classic
loop emitters instead of the MLIR fusion emitters.

Measured side by side from cold caches (docs/results/house/xla_opt_level_ab.json): level 0 compiled the tiny
default's train step in 6.9 s against 14.2 s and ran it in 2.9-3.1 s against 1.5-1.8 s; five slow test files took
722 test-seconds against 1,133, but for the GRPO toy learning run, 702 s against 311 s. At level 0 the fusion
emitters cost most of what is left (docs/results/house/fusion_emitters_ab.json): without them the train step's code
generation took 2.8 s instead of 8.2 and its update ran no slower; at the default level they pay (it compiled
slower and ran slower without them). So the learning runs and the real-width rehearsal launch their runs with
neither flag (`run_speed_flags`, `run_speed_env`).
"""

from __future__ import annotations

import os

QUICK_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def suite_flags(devices: int = 8) -> str:
    """XLA_FLAGS for the suite's processes: `devices` fake CPU devices, compiled with the QUICK_COMPILE flags."""
    return " ".join((f"--xla_force_host_platform_device_count={devices}", *QUICK_COMPILE))


def run_speed_flags() -> str:
    """This process's XLA_FLAGS without the QUICK_COMPILE flags, for a run that runs more than it compiles (a
    learning run): XLA:CPU then optimises its programs as a user's run does."""
    return " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in QUICK_COMPILE)


def run_speed_env() -> dict[str, str]:
    """This process's environment with `run_speed_flags()`, for a learning run's subprocess."""
    return {**os.environ, "XLA_FLAGS": run_speed_flags()}
