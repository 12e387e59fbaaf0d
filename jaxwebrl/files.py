"""Writing a run's small files safely: a leaf module (standard library only), shared by the ring buffer's chunks and
control records, the run's config.json and the published transport files; and the one-owner lock files of a run's
workdir and buffer.

    write_file_atomically(path, [header, payload], fsync=False)   # readers see the old or the new file, never a mix
    with exclusive_lock(path, "pid 12 on host a", refused=lambda holder: MyError(holder)): ...
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from typing import Callable


def write_file_atomically(path: str, parts: list, fsync: bool) -> None:
    """Replaces `path` by the concatenation of byte buffers `parts`: temp file + rename, so a reader
    sees the old or the new content, never a mix, and a writer killed midway leaves only a temp file."""
    tmp = f"{path}.__tmp{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            views = [memoryview(p).cast("B") for p in parts]
            while views:
                written = os.writev(fd, views)
                while views and written >= len(views[0]):
                    written -= len(views[0])
                    views.pop(0)
                if views and written:
                    views[0] = views[0][written:]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk must not keep the half-written temp file
            os.unlink(tmp)
        raise
    if fsync:  # make the rename itself durable
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def exclusive_lock(path: str, holder: str, refused: Callable[[str], BaseException]):
    """Holds an exclusive flock on `path` (created 0600) while the block runs, with `holder` written in the file;
    raises `refused(what the holding process wrote)` at once when another process holds it. The kernel drops the
    lock when its process dies, so a killed owner never blocks the next one (flock also works on NFS)."""
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise refused(f.read().strip() or "unknown") from None
        f.seek(0)
        f.truncate()
        f.write(holder)
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
