"""Real small and read-only filesystems for disk-full / read-only tests: a tmpfs mounted for the test.

Mounting needs root (CAP_SYS_ADMIN); elsewhere the tests that use these skip and say why.
"""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path, size_kib: int, *, read_only: bool = False):
    """Mounts a tmpfs of `size_kib` KiB at `path` (created) for the block; unmounted (lazily) afterwards."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    options = f"size={size_kib}k,mode=0700" + (",ro" if read_only else "")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def remount_read_only(path) -> None:
    """Makes a tmpfs from `tmpfs` read-only in place (its files stay)."""
    subprocess.run(["mount", "-o", "remount,ro", os.fspath(path)], check=True, capture_output=True)


def fill(path) -> None:
    """Fills the filesystem holding `path` until a write fails with ENOSPC."""
    fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
