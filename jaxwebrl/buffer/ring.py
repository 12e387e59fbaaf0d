"""RingBuffer: many writers append whole episodes, readers take new committed episodes since a cursor.

    buf = RingBuffer.create(path, capacity_steps=4096, max_seq_len=2048, screenshot_shape=(720, 1280, 3))
    ref = buf.screenshots.put(image)                 # worker, during the episode
    episode_id = buf.append(episode)                 # an Episode (buffer/episode.py): visible all at once, or not
    episodes, cursor = buf.read(since=cursor)        # every committed Episode since the cursor, in commit order
    result = buf.read(since=cursor, group_size=G)    # whole groups only: result.groups

The cursor is a small JSON dict ({"next": log seq, "pending": [log seqs held back for their group]});
store it in the trainer checkpoint and a restarted trainer neither re-trains nor skips episodes.
See commit.py for the commit protocol and storage.py for which backends take several writers.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import time
from typing import Collection

import numpy as np
import tensorstore as ts

from jaxwebrl.buffer import integrity, storage
from jaxwebrl.buffer.commit import DAMAGED, RESERVE_KEY, CommitLog, Lease, Reservations, read_lease, writer_alive
from jaxwebrl.buffer.episode import Episode, EpisodeError
from jaxwebrl.buffer.rows import from_rows, to_rows
from jaxwebrl.buffer.schema import (CREATING_KEY, FORMAT_NAME, META_KEY, TRAINER_LOCK_KEY, BufferConfig,
                                    BufferFormatError, row_dtype, shot_dtype)
from jaxwebrl.buffer.screenshots import ScreenshotStore, dedup_images

log = logging.getLogger(__name__)

ROW_IO_IN_FLIGHT = 8  # step rows are small chunks: a few concurrent TensorStore reads/writes help
READ_STAT_KEYS = ("returned", "overwritten", "lost", "incomplete", "corrupt", "surplus", "pending")
LIVE_WRITER_RECHECK_S = 5.0  # a writer seen alive is asked again after this long


class RingOverrun(RuntimeError):
    """The ring wrapped over an episode before its writer could commit it (capacity too small)."""


@dataclasses.dataclass
class ReadResult:
    """What `read` returns; unpacks as `episodes, cursor`.

    episodes: committed Episodes (episode_id set) in commit order. cursor: JSON-able dict to pass as `since`.
    stats: counts for this call: returned, overwritten (the ring reused their slots before they were read),
    lost (commit records lapped before being read), incomplete (members of a group that can no longer complete:
    its writer died, or `group_wait` newer commits passed it), corrupt (a row fails its checksum or is
    unreadable), pending (held for their group).
    groups: with `group_size`, the same episodes as whole groups (lists of one group_id's episodes, each in
    commit order; groups in the commit order of their first episode); None without.
    """

    episodes: list
    cursor: dict
    stats: dict
    groups: list | None = None

    def __iter__(self):
        return iter((self.episodes, self.cursor))

    def __len__(self):
        return 2


def _normalise_cursor(since) -> dict | None:
    if since is None:
        return None
    if isinstance(since, (int, np.integer)):
        return {"next": int(since), "pending": []}
    if isinstance(since, dict) and isinstance(since.get("next"), (int, np.integer)) and since["next"] >= 0:
        pending = [int(p) for p in since.get("pending", [])]
        return {"next": int(since["next"]), "pending": pending}
    raise ValueError(f"cursor must be None, an int or a dict from a previous read(), got {since!r}")


def _data_keys(kv: ts.KvStore) -> list[bytes]:
    """The location's keys but the owning trainer's lock file, which may come before the buffer (owner.py)."""
    return [key for key in kv.list().result() if key != TRAINER_LOCK_KEY.encode()]


# What `create` writes before its metadata, in order (CREATING_KEY first): a location that holds its marker and
# nothing else is a creation that did not finish, in which no episode was ever committed (none can be before the
# metadata exists)
CREATION_KEYS = frozenset({CREATING_KEY, "rows/zarr.json", "screenshots/zarr.json", RESERVE_KEY})


def _unfinished_creation(keys: list[bytes]) -> bool:
    """Whether the keys (without the metadata) are only what a `create` killed halfway leaves, its marker among them."""
    names = {key.decode(errors="replace") for key in keys}
    return CREATING_KEY in names and names <= CREATION_KEYS


class RingBuffer:
    """A TensorStore ring buffer of episodes; one instance per process (writers and readers alike)."""

    def __init__(self, spec: dict, config: BufferConfig, kv: ts.KvStore, *, create: bool):
        """Use RingBuffer.create / RingBuffer.open."""
        self.spec = spec
        self.where = storage.describe(spec)
        self.config = config
        self._kv = kv
        direct, driver = config.direct_file_io, spec["driver"]
        self.control = storage.open_control(kv, spec, config.fsync, direct)
        self.reservations = Reservations(self.control, self.where)
        self.log = CommitLog(self.control, config.log_capacity, self.where)
        self._lease = Lease(self.control)
        arrays = []
        for sub, itemsize, records in (("rows/", row_dtype(config).itemsize, config.capacity_steps),
                                       ("screenshots/", shot_dtype(config).itemsize, config.capacity_screenshots)):
            try:
                arrays.append(storage.open_records_array(kv, sub, records, itemsize, create=create,
                                                         fsync=config.fsync, driver=driver, direct=direct))
            except ValueError as e:
                raise BufferFormatError(f"{self.where}/{sub} is missing or corrupt ({e}); recreate the buffer "
                                        f"with RingBuffer.create") from None
        self._rows, shots = arrays
        self._row_dtype = row_dtype(config)
        self.screenshots = ScreenshotStore(shots, self.reservations, self._lease, config)
        self.stats = collections.Counter({k: 0 for k in READ_STAT_KEYS})
        self.commit_seconds: list[float] = []  # per append: publishing the commit record
        self._writers_seen_alive: dict[str, float] = {}   # writer id -> when it was last seen alive

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def create(cls, path, *, capacity_steps: int, max_seq_len: int, screenshot_shape, capacity_screenshots=None,
               max_images_per_step: int = 8, log_capacity: int = 0, fsync: bool = False,
               direct_file_io: bool = True, vocab_size: int = 0, overwrite: bool = False) -> "RingBuffer":
        """Creates an empty buffer at `path` (path, kvstore URL or spec; see storage.py).

        capacity_screenshots defaults to capacity_steps; vocab_size (the policy's) makes `append` refuse token
        ids outside the vocabulary; see BufferConfig for the other fields.
        Refuses a location that already holds data unless overwrite=True (which erases it); what a creation killed
        halfway left (its marker, no metadata, no episode) is erased and created again, with a log line.
        """
        config = BufferConfig(capacity_steps=capacity_steps, max_seq_len=max_seq_len,
                              screenshot_shape=tuple(screenshot_shape),
                              capacity_screenshots=capacity_screenshots or capacity_steps,
                              max_images_per_step=max_images_per_step, log_capacity=log_capacity, fsync=fsync,
                              direct_file_io=direct_file_io, vocab_size=vocab_size)
        spec = storage.kvstore_spec(path)
        kv = storage.open_kvstore(spec, fsync)
        existing = _data_keys(kv)
        if existing and not overwrite:
            if not _unfinished_creation(existing):
                what = "a jaxwebrl buffer" if META_KEY.encode() in existing else f"{len(existing)} other keys"
                raise FileExistsError(f"{storage.describe(spec)} already holds {what}; open it with RingBuffer.open, "
                                      f"pick an empty location, or pass overwrite=True to erase it")
            log.warning("ring buffer %s: its creation did not finish (%d keys, no metadata, no episode): created "
                        "again", storage.describe(spec), len(existing))
        if existing:   # everything but the owner's lock (deleting a held lock file would let a second owner in)
            kv.delete_range(ts.KvStore.KeyRange(exclusive_max=TRAINER_LOCK_KEY)).result()
            kv.delete_range(ts.KvStore.KeyRange(inclusive_min=TRAINER_LOCK_KEY + "\0")).result()
        kv.write(CREATING_KEY, json.dumps({"format": FORMAT_NAME}).encode()).result()   # first
        buf = cls(spec, config, kv, create=True)
        buf.reservations.initialise()
        kv.write(META_KEY, config.to_json().encode()).result()  # last: a half-made buffer is not openable
        kv.write(CREATING_KEY, None).result()   # None: delete
        return buf

    @classmethod
    def exists(cls, path) -> bool:
        """Whether `path` (path, kvstore URL or spec) holds a buffer's metadata: RingBuffer.open applies there."""
        spec = storage.kvstore_spec(path)
        return storage.open_kvstore(spec, False).read(META_KEY).result().state == "value"

    @classmethod
    def open(cls, path) -> "RingBuffer":
        """Opens an existing buffer; a missing, foreign or corrupt one raises BufferFormatError."""
        spec = storage.kvstore_spec(path)
        where = storage.describe(spec)
        kv = storage.open_kvstore(spec, False)
        meta = kv.read(META_KEY).result()
        if meta.state != "value":
            keys = _data_keys(kv)
            if _unfinished_creation(keys):
                raise BufferFormatError(f"the ring buffer at {where} was never finished (its creation was "
                                        f"interrupted; no episode is in it): the next start of its training run "
                                        f"creates it again")
            if keys:
                raise BufferFormatError(f"{where} is not a jaxwebrl ring buffer: it has {len(keys)} keys but no "
                                        f"{META_KEY}; point at a directory made by RingBuffer.create")
            raise BufferFormatError(f"no ring buffer at {where}; create one with RingBuffer.create")
        config = BufferConfig.from_json(meta.value, where)
        if config.fsync:
            kv = storage.open_kvstore(spec, True)
        buf = cls(spec, config, kv, create=False)
        buf.reservations.heads()  # fails clearly when the control record is damaged
        return buf

    # -- writing ---------------------------------------------------------------------------------
    def append(self, episode: Episode) -> int:
        """Writes and commits one episode; returns its episode_id (a global int).

        Raises EpisodeError (nothing written) when it does not fit this buffer (`Episode.check_fits`: the
        constructor checked the rest), BufferWriteError (nothing visible) when the machine refuses the write
        (disk full, read-only).
        """
        if not isinstance(episode, Episode):
            raise EpisodeError(f"episode refused: expected a jaxwebrl.buffer.episode.Episode, got "
                               f"{type(episode).__name__}; build one with Episode(steps=..., task_id=..., ...)")
        episode.check_fits(self.config)
        with storage.writing(self.where):
            return self._write(episode)

    def _write(self, ep: Episode) -> int:
        """Reserve, write the images and rows, publish the commit record (commit.py); returns the episode id."""
        S = ep.num_steps
        refs = ep.screenshot_refs
        if ep.screenshots is not None:
            used = np.unique(refs[refs >= 0])
            keep, index_map = dedup_images(ep.screenshots, used)
            local_to_unique = np.full(len(ep.screenshots), -1, np.int64)
            local_to_unique[used] = index_map
            n_new = len(keep)
        else:
            n_new = 0
            given = refs[refs >= 0]
            live = self.screenshots.is_live(given)
            if not live.all():
                raise EpisodeError(f"episode refused: screenshot refs {given[~live][:4].tolist()} are not live "
                                   f"(never put, or overwritten); put() screenshots during the episode or pass "
                                   f"them as Episode.screenshots with local indices")
        step_start, shot_start = self.reservations.reserve(S, n_new)
        self._lease.record(steps=[step_start, step_start + S], shots=[shot_start, shot_start + n_new])
        global_refs = refs
        if ep.screenshots is not None:
            global_refs = np.full_like(refs, -1)
            global_refs[refs >= 0] = shot_start + local_to_unique[refs[refs >= 0]]
            self.screenshots.write_reserved(ep.screenshots, shot_start + np.arange(n_new), index=used[keep])
        rows = to_rows(ep, self.config, step_start, global_refs)
        self._rows.write_many((step_start + np.arange(S)) % self.config.capacity_steps, rows,
                              in_flight=ROW_IO_IN_FLIGHT)
        t0 = time.perf_counter()
        heads = self.reservations.heads()
        valid = global_refs[global_refs >= 0]
        oldest_ref = int(valid.min()) if valid.size else -1
        if heads["steps"] > step_start + self.config.capacity_steps or (
                oldest_ref >= 0 and not self.screenshots.is_live([oldest_ref], heads)[0]):
            raise RingOverrun(f"the ring wrapped over episode {step_start} before it was committed; raise "
                              f"capacity_steps/capacity_screenshots (now {self.config.capacity_steps}/"
                              f"{self.config.capacity_screenshots}) so the ring holds many episodes in flight")
        record = {"episode_id": step_start, "first_step": step_start, "num_steps": S,
                  "oldest_ref": oldest_ref, "refs_width": int(refs.shape[1]),
                  "task_id": ep.task_id, "group_id": ep.group_id,
                  "min_version": ep.min_version, "max_version": ep.max_version,
                  "reward": ep.reward, "time": time.time(),
                  "writer": self._lease.writer_id, "info": ep.info}
        self.log.publish(record)
        self.commit_seconds.append(time.perf_counter() - t0)
        return step_start

    # -- reading ---------------------------------------------------------------------------------
    def oldest_cursor(self) -> dict:
        """Cursor at the oldest commit record still in the log."""
        return {"next": max(0, self.log.end() - self.config.log_capacity), "pending": []}

    def latest_cursor(self) -> dict:
        """Cursor past every committed episode (read only what comes next)."""
        return {"next": self.log.end(), "pending": []}

    def newest_version(self, since=None) -> int:
        """The newest policy version of the episodes committed from cursor `since` on (None: the oldest retained),
        held-back group members included; -1 when there are none. Reads commit records only, not step rows."""
        cursor = _normalise_cursor(since) or self.oldest_cursor()
        records, _ = self._scan_log(cursor["next"], None, collections.Counter())
        pending = [r for r in (self.log.read_slot(seq) for seq in cursor["pending"]) if r not in (None, DAMAGED)]
        return max((int(r["max_version"]) for r in records + pending), default=-1)

    def _scan_log(self, start: int, limit: int | None, stats: collections.Counter) -> tuple[list, int]:
        """New commit records from log seq `start` on (at most `limit`); returns (records, next seq)."""
        L = self.config.log_capacity
        records, n = [], start
        while limit is None or len(records) < limit:
            batch = min(64, L) if limit is None else min(64, L, limit - len(records))
            found_end = False
            for rec in self.log.read_range(n, batch):
                seq = None if rec is None else int(rec["seq"])
                if seq is None or seq < n:
                    found_end = True
                    break
                if seq > n:  # the log lapped this reader: records n .. seq - L are gone
                    stats["lost"] += seq - L + 1 - n
                    n = seq - L + 1
                    break
                records.append(rec)
                n += 1
            else:
                continue
            if not found_end:
                continue
            if not self.log.taken_after(n):
                break
            again = self.log.read_slot(n)   # n was taken before n + 1: its record is there now, or it never will be
            if again is None or int(again["seq"]) < n:
                stats["corrupt"] += 1
                log.warning("ring buffer %s: the commit record of log seq %d is unreadable (damaged on disk or "
                            "deleted): its episode is dropped, the log goes on", self.where, n)
                n += 1
        if not records and n > 0 and n == start:
            before = self.log.read_slot(n - 1)
            if before is None or before is not DAMAGED and int(before["seq"]) < n - 1:
                raise ValueError(f"cursor next={n} is ahead of the commit log of {self.where} (was the buffer "
                                 f"recreated?); start again with since=None")
        return records, n

    def read(self, since=None, *, group_size: int | None = None, group_wait: int | None = None,
             max_episodes: int | None = None, held_back: Collection[int] | None = None) -> ReadResult:
        """Whole committed episodes since `since` (None: the oldest retained), as host arrays.

        group_size: return only groups (same group_id) with that many episodes; members of a group
          still filling are held in the cursor's "pending" list, and given up as incomplete once
          `group_wait` (default log_capacity // 2) newer commits have passed them, or at once when the
          writer that committed them is dead (it will never finish the group), or when a member of the
          group was overwritten or is corrupt. A partial group is never returned, nor more than `group_size` of
          one: members past its first `group_size` commits are counted as surplus and skipped (a worker that
          replays a slot whose episode did land, after a write error that came too late to undo it).
        max_episodes: read at most this many new commit records.
        held_back: the log seqs another reader of the same range held back (process 0 of a multi-host trainer,
          parallel/multihost.py): a partial group is held back when its members are among them, else given up as
          incomplete, so every process decides as process 0 did (no liveness check or clock of its own).
        Returns a ReadResult (unpacks as `episodes, cursor`; counts in .stats and summed in self.stats).
        """
        cursor = _normalise_cursor(since) or self.oldest_cursor()
        stats = collections.Counter({k: 0 for k in READ_STAT_KEYS})
        new, next_seq = self._scan_log(cursor["next"], max_episodes, stats)
        candidates = []
        for seq in cursor["pending"]:
            rec = self.log.read_slot(seq)
            if rec is None or int(rec["seq"]) != seq:
                stats["lost"] += 1
            else:
                candidates.append(rec)
        kept = candidates + new
        pending = []
        if group_size is not None:
            wait = group_wait if group_wait is not None else max(1, self.config.log_capacity // 2)
            groups = collections.defaultdict(list)
            for rec in kept:
                groups[rec["group_id"]].append(rec)
            kept = []
            for members in groups.values():
                if len(members) >= group_size:
                    kept += members
                elif self._holds_back(members, next_seq - wait, held_back):
                    pending += members
                else:
                    stats["incomplete"] += len(members)
            kept.sort(key=lambda r: int(r["seq"]))
            stats["pending"] = len(pending)
        episodes = self._load(kept, stats)
        groups = None
        if group_size is not None:   # a member overwritten or corrupt leaves a group that can never complete
            by_group: dict = {}
            for episode in episodes:
                by_group.setdefault(episode.group_id, []).append(episode)
            groups = [members[:group_size] for members in by_group.values() if len(members) >= group_size]
            stats["incomplete"] += sum(len(m) for m in by_group.values() if len(m) < group_size)
            stats["surplus"] += sum(len(m) - group_size for m in by_group.values() if len(m) > group_size)
            whole = {id(episode) for members in groups for episode in members}
            episodes = [episode for episode in episodes if id(episode) in whole]
        stats["returned"] = len(episodes)
        self.stats.update({k: v for k, v in stats.items() if k != "pending"})
        self.stats["pending"] = stats["pending"]
        new_cursor = {"next": next_seq, "pending": sorted(int(r["seq"]) for r in pending)}
        return ReadResult(episodes, new_cursor, dict(stats), groups)

    def _holds_back(self, members: list, oldest_waiting: int, held_back: Collection[int] | None) -> bool:
        """Whether a partial group waits for its missing members: as another reader decided (`held_back`), else
        while its first member is not older than log seq `oldest_waiting` and its writer may still complete it."""
        if held_back is not None:
            return int(members[0]["seq"]) in held_back
        return min(int(r["seq"]) for r in members) >= oldest_waiting and self._may_complete(members)

    def _may_complete(self, members: list) -> bool:
        """False when the writer that committed a partial group is gone (its process died: the group can never
        get its missing episodes, a restarted worker starts new groups)."""
        writer = members[0].get("writer")
        if writer is None or any(r.get("writer") != writer for r in members):
            return True
        seen = self._writers_seen_alive.get(writer)
        now = time.monotonic()
        if seen is not None and now - seen < LIVE_WRITER_RECHECK_S:
            return True
        if not writer_alive(read_lease(self.control, writer)):   # not remembered: a stalled remote writer comes back
            return False
        self._writers_seen_alive[writer] = now
        return True

    def load_rows(self, records: list) -> list[tuple[np.ndarray | None, str]]:
        """(structured rows [S] or None, integrity status) of each commit record's step rows, read now."""
        C = self.config.capacity_steps
        slots = [(int(r["first_step"]) + np.arange(int(r["num_steps"]))) % C for r in records]
        flat = self._rows.read_many(np.concatenate(slots) if slots else [], ROW_IO_IN_FLIGHT)
        bounds = np.cumsum([0] + [len(ss) for ss in slots])
        out = []
        for rec, a, b in zip(records, bounds[:-1], bounds[1:]):
            raw = flat[a:b]
            rows = None if any(r is None for r in raw) else np.stack(raw).view(self._row_dtype)[:, 0]
            expected = int(rec["first_step"]) + np.arange(int(rec["num_steps"]), dtype=np.int64)
            out.append((rows, integrity.rows_status(rows, expected, self.config)))
        return out

    def _load(self, records: list, stats: collections.Counter) -> list:
        """Reads the rows of `records`, keeping episodes whose rows and screenshots are still theirs."""
        loaded = self.load_rows(records)
        heads = self.reservations.heads()  # read after the rows: a later reservation shows up here
        episodes, corrupt = [], []
        for rec, (rows, status) in zip(records, loaded):
            shots_ok = rec["oldest_ref"] < 0 or self.screenshots.is_live([rec["oldest_ref"]], heads)[0]
            if status == integrity.CORRUPT:
                corrupt.append(int(rec["episode_id"]))
            elif status == integrity.OVERWRITTEN or not shots_ok:
                stats["overwritten"] += 1
            else:
                try:
                    episodes.append(from_rows(rows, rec))
                except EpisodeError:   # rows that pass their checksums but disagree with each other: damage
                    corrupt.append(int(rec["episode_id"]))
        if corrupt:
            stats["corrupt"] += len(corrupt)
            log.warning("ring buffer %s: %d committed episodes have damaged step rows (checksum mismatch or "
                        "unreadable chunk, or rows that disagree) and are dropped: episode ids %s", self.where, len(corrupt), corrupt[:8])
        return episodes
