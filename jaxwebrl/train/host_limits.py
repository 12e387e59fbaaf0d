"""Limits of the host that a long run can hit without its own fault, said once at start-up.

    line = map_limit_warning()   # None, or one line naming the fix

The kernel bounds the memory maps one process may hold (`vm.max_map_count`, 65,530 by default). XLA's CPU backend
keeps the code of every compiled program mapped, and a run's trainer compiles its update once per batch shape and
length layout (`train/length_layouts.py`): on a tiny run here, about 2,300 maps a compile of the train step. A run
that reaches the limit dies in a compile with "LLVM compilation error: Cannot allocate memory" though memory is
free (the browser study's aborts of 5 December).
"""

from __future__ import annotations

MAP_COUNT_PATH = "/proc/sys/vm/max_map_count"
ENOUGH_MAPS = 262_144


def map_limit_warning(path: str = MAP_COUNT_PATH) -> str | None:
    """One line naming the fix when `vm.max_map_count` (read from `path`) is below ENOUGH_MAPS; None when it is
    enough or cannot be read (not Linux)."""
    try:
        with open(path, encoding="ascii") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return None
    if limit >= ENOUGH_MAPS:
        return None
    return (f"vm.max_map_count is {limit}: every XLA compile keeps its code mapped, and a long run that compiles "
            f"many batch shapes can reach the limit and abort in a compile ('LLVM compilation error: Cannot "
            f"allocate memory') with memory free; raise it: sudo sysctl -w vm.max_map_count={ENOUGH_MAPS}")
