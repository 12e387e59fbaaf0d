"""Writing a run's small files safely: a leaf module (standard library only), shared by the ring buffer's chunks and
control records, the run's config.json and the published transport files.

    write_file_atomically(path, [header, payload], fsync=False)   # readers see the old or the new file, never a mix
"""

from __future__ import annotations

import contextlib
import os
import threading


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
