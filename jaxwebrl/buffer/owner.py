"""One training run per ring buffer: the trainer holds `<buffer>/trainer.lock` for its whole life.

    with trainer_lock(path):     # a second trainer on the same buffer: BufferInUse, one line
        ...                      # train: read, consume, stamp policy versions

Two trainers on one buffer would both consume its episodes (each trains on the same groups) and stamp clashing
policy versions on them; the workdir lock (train/workdir.py) does not catch two workdirs sharing a
`buffer.path`. Only the owner takes this lock: rollout workers (writers), `python3 -m jaxwebrl.buffer.inspect`
and evaluation (readers) never do, so they work while a trainer runs.

On the local `file` driver (a path or file://) the lock is an flock, which the kernel drops when its process
dies (a crashed run never blocks its resumption) and which also holds across hosts on NFS. Other kvstores (gs://,
s3://, memory://) have no lock that dies with its process: the run logs a warning that nothing keeps a second
trainer off that buffer, and goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

from jaxwebrl.buffer import storage
from jaxwebrl.buffer.schema import TRAINER_LOCK_KEY
from jaxwebrl.errors import BufferInUse
from jaxwebrl.files import exclusive_lock

log = logging.getLogger(__name__)


@contextlib.contextmanager
def trainer_lock(path):
    """Holds the buffer at `path` (path, kvstore URL or spec; it need not exist yet) for this process while the
    block runs; BufferInUse naming the buffer, the holder's pid and host, and the fix when another run holds it."""
    spec = storage.kvstore_spec(path)
    where = storage.describe(spec)
    if spec["driver"] != "file":
        log.warning("ring buffer %s is not on local files: no lock keeps a second training run off it (give every "
                    "run its own buffer.path)", where)
        yield
        return
    root = spec["path"]
    os.makedirs(root, mode=0o700, exist_ok=True)

    def refused(holder: str) -> BufferInUse:
        return BufferInUse(f"ring buffer {where} is in use by another training run ({holder}): stop that run, or "
                           "give this one its own --config.buffer.path (unset, it is WORKDIR/buffer)")

    with exclusive_lock(os.path.join(root, TRAINER_LOCK_KEY), f"pid {os.getpid()} on host {socket.gethostname()}",
                        refused):
        yield
