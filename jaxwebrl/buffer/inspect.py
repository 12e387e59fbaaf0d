"""`python -m jaxwebrl.buffer.inspect DIR` prints a JSON summary of a ring buffer.

Capacity, reserved heads, committed episodes still readable, cursor range, policy versions, reward
mean, and slots that are reserved but not committed: `in_flight` (a live writer holds them) or
`orphaned` (their writer died; the ring reuses them on its next lap), and on local files the
temp files such writers left behind (`temp_files`, safe to delete).

Every committed episode's rows and screenshots are read back and checked (stamps, per-record checksums):
damaged ones are reported as `corrupt_episodes` (with their ids) and not counted as committed; `--quick`
reads only the commit log (no integrity check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from jaxwebrl.buffer import integrity
from jaxwebrl.buffer.commit import DAMAGED, read_leases, writer_alive
from jaxwebrl.buffer.control import LocalControl
from jaxwebrl.buffer.episode import EpisodeError
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.rows import from_rows
from jaxwebrl.buffer.schema import META_KEY
from jaxwebrl.buffer.screenshots import ScreenshotCorrupt, ScreenshotOverwritten

def damaged(buf: RingBuffer, records: list) -> tuple[list, list]:
    """(intact records, ids of corrupt episodes): reads back every record's rows (decoded into an Episode, as a
    read does) and screenshots."""
    intact, corrupt = [], []
    for rec, (rows, status) in zip(records, buf.load_rows(records)):
        if status == integrity.OK:
            refs = rows["screenshot_refs"][:, :int(rec["refs_width"])]
            try:
                from_rows(rows, rec)
                for ref in np.unique(refs[refs >= 0]):
                    buf.screenshots.get(int(ref))
            except (ScreenshotCorrupt, EpisodeError):
                status = integrity.CORRUPT
            except ScreenshotOverwritten:
                status = integrity.OVERWRITTEN
        if status == integrity.CORRUPT:
            corrupt.append(int(rec["episode_id"]))
        elif status == integrity.OK:
            intact.append(rec)
    return intact, corrupt


def summarize(buf: RingBuffer, *, verify: bool = True) -> dict:
    """JSON-able summary of `buf`; verify: read back and check every committed episode (else the log only)."""
    cfg = buf.config
    heads = buf.reservations.heads()
    end = buf.log.end()
    oldest = max(0, end - cfg.log_capacity)
    slots = buf.log.read_range(oldest, end - oldest)
    records = [r for r in slots if r is not None and r is not DAMAGED]
    live = [r for r in records
            if heads["steps"] <= int(r["first_step"]) + cfg.capacity_steps
            and (r["oldest_ref"] < 0 or buf.screenshots.is_live([r["oldest_ref"]], heads)[0])]
    corrupt = None
    if verify:
        live, corrupt = damaged(buf, live)
    window = np.arange(max(0, heads["steps"] - cfg.capacity_steps), heads["steps"])
    covered = np.zeros(len(window), bool)
    for r in records:
        first, n = int(r["first_step"]), int(r["num_steps"])
        covered |= (window >= first) & (window < first + n)
    leases = read_leases(buf.control)
    held = np.zeros(len(window), bool)
    for lease in leases:
        steps = lease.get("steps")
        if steps and writer_alive(lease):
            held |= (window >= steps[0]) & (window < steps[1])
    uncommitted = ~covered
    summary = {
        "path": buf.where,
        "capacity_steps": cfg.capacity_steps,
        "capacity_screenshots": cfg.capacity_screenshots,
        "max_seq_len": cfg.max_seq_len,
        "screenshot_shape": list(cfg.screenshot_shape),
        "max_images_per_step": cfg.max_images_per_step,
        "log_capacity": cfg.log_capacity,
        "fsync": cfg.fsync,
        "reserved": heads,
        "committed_episodes": len(live),
        "committed_steps": int(sum(int(r["num_steps"]) for r in live)),
        "cursor_range": {"oldest": int(live[0]["seq"]) if live else end, "next": end},
        "versions": {"min": min((int(r["min_version"]) for r in live), default=None),
                     "max": max((int(r["max_version"]) for r in live), default=None)},
        "reward_mean": float(np.mean([r["reward"] for r in live])) if live else None,
        "tasks": len({r["task_id"] for r in live}),
        "groups": len({r["group_id"] for r in live}),
        "in_flight_steps": int((uncommitted & held).sum()),
        "orphaned_steps": int((uncommitted & ~held).sum()),
        "writers": len(leases),
        "damaged_commit_records": sum(r is DAMAGED for r in slots),   # their episodes are lost
        "checksums": cfg.checksums,
        "format_version": cfg.format_version,
        "vocab_size": cfg.vocab_size or None,
    }
    if corrupt is not None:
        summary["corrupt_episodes"] = len(corrupt)
        summary["corrupt_episode_ids"] = corrupt[:32]
    if isinstance(buf.control, LocalControl):  # temp files left by writers killed mid-write (safe to delete)
        root = buf.spec["path"]
        summary["temp_files"] = sum(
            sum(1 for entry in os.scandir(os.path.join(root, sub)) if ".__tmp" in entry.name)
            for sub in ("rows", "screenshots", "control", "log", "writers") if os.path.isdir(os.path.join(root, sub)))
    return summary


def local_buffer(path: str) -> str:
    """`path`, or PATH/buffer when `path` is a training run's workdir (it holds the buffer there)."""
    inner = os.path.join(path, "buffer")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, META_KEY)) and \
            os.path.isfile(os.path.join(inner, META_KEY)):
        print(f"{path} is a run directory: inspecting its buffer {inner}", file=sys.stderr)
        return inner
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxwebrl.buffer.inspect", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="buffer directory, kvstore URL (memory://, gs://...) or JSON kvstore spec")
    parser.add_argument("--quick", action="store_true", help="read the commit log only; skip the integrity check")
    args = parser.parse_args(argv)
    path = json.loads(args.path) if args.path.lstrip().startswith("{") else local_buffer(args.path)
    try:
        buf = RingBuffer.open(path)
    except ValueError as e:  # BufferFormatError is a ValueError
        print(json.dumps({"error": f"{e} (a training run keeps its buffer in WORKDIR/buffer)"}), file=sys.stderr)
        return 2
    print(json.dumps(summarize(buf, verify=not args.quick), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
