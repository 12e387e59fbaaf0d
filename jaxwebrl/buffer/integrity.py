"""Is a record read back the one that was committed, one a later writer replaced, or damaged on disk?

Every step row and screenshot starts with its global sequence number (`stamp`); format 2 and 3 buffers also carry a
32-bit checksum per record (schema.py: CRC-32 in format 3, format 2's block sums in a format-2 buffer). A record is
- "ok": its checksum holds and the stamp is the one expected;
- "overwritten": its checksum holds but another lap of the ring wrote it (a stamp of the same slot: a later writer's,
  or an earlier one's whose writer the ring lapped before its write landed), or the slot was never written (a
  screenshot whose writer was killed before it landed);
- "corrupt": the checksum fails, the stamp cannot belong to this slot, or the chunk is unreadable / short.
Format-1 buffers have no checksum: a stamp mismatch counts as overwritten there, as it always did.
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.buffer.schema import SHOT_MAGIC, SHOT_MAGIC_HIGH, BufferConfig, row_checksums, shot_magic

OK, OVERWRITTEN, CORRUPT = "ok", "overwritten", "corrupt"


def _other_lap(stamps: np.ndarray, expected: np.ndarray, capacity: int) -> np.ndarray:
    """The stamps belong to the expected ones' slots, in another lap of the ring."""
    return (stamps >= 0) & (stamps != expected) & ((stamps - expected) % capacity == 0)


def rows_status(rows: np.ndarray | None, expected: np.ndarray, config: BufferConfig) -> str:
    """Status of one episode's step rows: structured rows [S] (None when a chunk was unreadable), expected
    stamps [S] int64, the buffer's config (its capacity_steps and format)."""
    if rows is None:
        return CORRUPT
    stamps = rows["stamp"].astype(np.int64)
    if not config.checksums:
        return OK if np.array_equal(stamps, expected) else OVERWRITTEN
    if not np.array_equal(row_checksums(rows, config), rows["checksum"]):
        return CORRUPT
    if np.array_equal(stamps, expected):
        return OK
    moved = stamps != expected
    return OVERWRITTEN if _other_lap(stamps[moved], expected[moved], config.capacity_steps).all() else CORRUPT


def shot_status(ref: int, stamp: int, magic: int, pixels: np.ndarray, config: BufferConfig) -> str:
    """Status of one screenshot chunk read for `ref` (header stamp and magic, pixels uint8 [H, W, 3])."""
    if not config.checksums:
        return OK if stamp == ref and magic == SHOT_MAGIC else OVERWRITTEN
    if stamp == 0 and magic == 0:
        return OVERWRITTEN   # never written (fill value): its writer died before the image landed
    if magic >> 32 != SHOT_MAGIC_HIGH or magic != shot_magic(stamp, pixels, config):
        return CORRUPT
    if stamp == ref:
        return OK
    return OVERWRITTEN if _other_lap(np.int64(stamp), np.int64(ref), config.capacity_screenshots) else CORRUPT
