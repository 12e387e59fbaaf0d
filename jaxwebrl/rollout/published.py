"""What a running training run publishes for rollout workers that join it by hand (launch/rollout.py --workdir), and
reading it back: its policy server's address, public key and token, the fingerprint a joining host must agree on,
and the ids of the run's own workers. Free of JAX: a worker process's engine judge reads it too.

    write_published(WORKDIR, address=..., token=..., server_key=..., fingerprint=..., worker_ids=range(0, 2))
    read_published(WORKDIR)   # {"address", "token", "server_key", "fingerprint", "worker_ids"}; ValueError, one line

WORKDIR/transport.json holds the public part ({"address", "server_key", "fingerprint", "worker_ids": [first, end]}),
WORKDIR/transport.token the shared token (mode 0600).
"""

from __future__ import annotations

import json
import os
import stat

from jaxwebrl.files import write_file_atomically

TRANSPORT_FILE = "transport.json"
TOKEN_FILE = "transport.token"


def write_published(workdir: str, *, address: str, token: str, server_key: str | None, fingerprint: dict | None,
                    worker_ids: range | None) -> None:
    """WORKDIR/transport.token and WORKDIR/transport.json, each written atomically, readable by its owner only."""
    _write_private(os.path.join(workdir, TOKEN_FILE), token + "\n")
    _write_private(os.path.join(workdir, TRANSPORT_FILE),
                   json.dumps({"address": address, "server_key": server_key, "fingerprint": fingerprint,
                               "worker_ids": None if worker_ids is None else [worker_ids.start, worker_ids.stop]},
                              indent=2) + "\n")


def read_published(workdir: str) -> dict:
    """{"address", "token", "server_key", "fingerprint", "worker_ids"} a run published in WORKDIR
    (`PolicyService.publish`; worker_ids a range, or None from a run that published none); ValueError (one
    line naming the file and the fix) when a file is missing, unreadable, malformed or the token file is not
    private."""
    files = {name: os.path.join(workdir, name) for name in (TRANSPORT_FILE, TOKEN_FILE)}
    try:
        with open(files[TRANSPORT_FILE], encoding="utf-8") as f:
            published = json.load(f)
        mode = os.stat(files[TOKEN_FILE]).st_mode
        with open(files[TOKEN_FILE], encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as err:
        raise ValueError(f"{err.filename}: {err.strerror}: start the training run first (it publishes its policy "
                         f"server there), or give --server and the token") from None
    except ValueError as err:
        raise ValueError(f"{files[TRANSPORT_FILE]}: not valid JSON ({err}): the run rewrites it when it starts")
    if not isinstance(published, dict) or not str(published.get("address", "")).startswith("tcp://"):
        raise ValueError(f"{files[TRANSPORT_FILE]}: no tcp:// 'address' in it: the run rewrites it when it starts")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{files[TOKEN_FILE]}: readable by others (mode {stat.S_IMODE(mode):o}): "
                         f"chmod 600 {files[TOKEN_FILE]}")
    if not token:
        raise ValueError(f"{files[TOKEN_FILE]}: empty: the run rewrites it when it starts")
    ids = published.get("worker_ids")
    if ids is not None and not (isinstance(ids, list) and len(ids) == 2 and all(type(i) is int for i in ids)):
        raise ValueError(f"{files[TRANSPORT_FILE]}: 'worker_ids' is {ids!r}, not [first, end]: the run rewrites it "
                         "when it starts")
    return {"address": published["address"], "token": token, "server_key": published.get("server_key"),
            "fingerprint": published.get("fingerprint"), "worker_ids": None if ids is None else range(*ids)}


def _write_private(path: str, text: str) -> None:
    """Write `text` to `path` atomically (temp file + rename), readable by its owner only (0600)."""
    write_file_atomically(path, [text.encode("utf-8")], fsync=False)
