"""Busy-looping processes beside a test, to shake out races that only a loaded CI machine shows.

    with cpu_hog(1):          # one process spinning on a core until the block ends
        ...
    python3 -m pytest tests/rollout/test_transport.py --cpu-hog=1    # the same for a whole session (conftest.py)

The hogs are plain `python3 -c 'while True: pass'` processes in their own process group, killed (SIGKILL) when
the block ends, and with the test process as their parent-death signal's target: a crashed pytest leaves none.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

_SPIN = ("import ctypes, os, signal\n"
         "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with pytest\n"
         "if os.getppid() == 1: raise SystemExit\n"
         "while True: pass\n")


@contextlib.contextmanager
def cpu_hog(n: int = 1):
    """Runs `n` CPU-bound processes while the block runs; yields their pids."""
    if n < 0:
        raise ValueError(f"cpu_hog needs n >= 0 processes, got {n}")
    hogs = [subprocess.Popen([sys.executable, "-c", _SPIN], start_new_session=True) for _ in range(n)]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
