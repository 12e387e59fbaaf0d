"""A run's workdir: proved writable before anything starts, held by one run at a time, private to its owner.

    check_workdir(workdir)           # creates it (0700) or raises WorkdirError naming the path and the fix
    remove_unused_workdir(workdir)   # a refused run's new workdir: gone again, when it holds only its lock
    with workdir_lock(workdir): ...  # a second run on the same workdir is one WorkdirError line
    os.umask(RUN_UMASK)              # files 0600, directories 0700 (workers and their browsers inherit it)
    record = read_record(path, fix)  # a JSON object the run wrote there, None when absent, else one WorkdirError
"""

from __future__ import annotations

import contextlib
import errno
import json
import os

from jaxwebrl.errors import WorkdirError, one_line
from jaxwebrl.files import exclusive_lock

RUN_UMASK = 0o077   # files a run creates (checkpoints, buffer, metrics, logs) are 0600, its directories 0700


def read_record(path: str, fix: str) -> dict | None:
    """The JSON object a run wrote at `path`, or None when there is none; a damaged file is one WorkdirError
    naming the path, the fault and `fix` (what to do about it)."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise WorkdirError(f"{path} is unreadable ({one_line(err, 80)}): {fix}") from None
    return record


def check_workdir(workdir: str) -> None:
    """Creates WORKDIR (0700) and proves it writable, or raises WorkdirError naming the path and the fix."""
    try:
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(probe)
    except OSError as err:
        where = err.filename or workdir
        if err.errno == errno.EROFS:
            fix = "it is on a read-only filesystem: pass a --workdir on a writable disk (or remount it rw)"
        elif err.errno in (errno.EACCES, errno.EPERM):
            fix = f"this user may not write there: pass another --workdir or fix its permissions (chmod u+w {where})"
        elif err.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "the disk is full: free space or pass a --workdir on another disk"
        else:
            fix = "pass a --workdir this user can create and write"
        raise WorkdirError(f"workdir {workdir} is not writable ({err.strerror or err}: {where}); {fix}") from None


def remove_unused_workdir(workdir: str) -> None:
    """Remove WORKDIR when it holds nothing but its train.lock (a run refused before it wrote anything: another
    run's buffer, a changed config), so the refused command leaves the disk as it found it."""
    try:
        if set(os.listdir(workdir)) <= {"train.lock"}:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(workdir, "train.lock"))
            os.rmdir(workdir)
    except OSError:   # not ours to clean after all (written meanwhile, or gone): leave it
        pass


@contextlib.contextmanager
def workdir_lock(workdir: str):
    """Holds an exclusive lock on WORKDIR/train.lock while the block runs: a second run on the same workdir would
    append to the same buffer and write the same checkpoints. The kernel drops the lock when its process dies,
    so a killed run never blocks its own resumption."""
    def refused(holder: str) -> WorkdirError:
        return WorkdirError(f"workdir {workdir} is in use by another training run (pid {holder}): stop that run "
                            "or pass another --workdir")

    with exclusive_lock(os.path.join(workdir, "train.lock"), str(os.getpid()), refused):
        yield
