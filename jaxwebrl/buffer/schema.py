"""On-disk layout of the ring buffer: configuration, metadata JSON and fixed-size row records.

Everything the buffer stores is JSON or a plain array; nothing is pickled.

Layout under the buffer root (any TensorStore kvstore):

    buffer.json          BufferConfig + format marker (written once by `create`)
    control/reserve      JSON {"steps": next step seq, "shots": next screenshot seq} (CAS counter)
    log/<slot>           JSON commit record of one episode (ring of `log_capacity` slots)
    writers/<id>         JSON lease of one writer: its current reservation (orphan diagnosis)
    locks/               flock files (local `file` driver with direct_file_io only)
    rows/                zarr3 uint8 [capacity_steps, row_itemsize], one chunk per step row (key c.<slot>.0)
    screenshots/         zarr3 uint8 [capacity_screenshots, shot_itemsize], one chunk per image (16-byte
                         header: stamp, magic; then H*W*3 pixels)

A step row and a screenshot are each ONE chunk (= one kvstore key, written atomically) that starts
with its own global sequence number (`stamp`). A reader that finds the stamp it expects knows the
whole row is the one that was committed, never a mix with a later writer's row.

Format 2 adds a 32-bit checksum (`checksum32`) to every record (rows: a `checksum` field over the row with
that field zeroed; screenshots: the low 32 bits of the header's magic, over stamp + pixels), so a reader tells
a record a later writer replaced (valid checksum, newer stamp of the same slot) from one damaged on disk.
Format 1 buffers (no checksums) are still read; their records are only stamp-checked.
"""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np

FORMAT_NAME = "jaxwebrl.buffer"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 1: no record checksums
META_KEY = "buffer.json"
TRAINER_LOCK_KEY = "trainer.lock"  # the owning training run's flock (owner.py); not buffer data
SHOT_MAGIC = 0x6A57524C53484F54  # "jWRLSHOT": format 1 screenshot header
SHOT_MAGIC_HIGH = SHOT_MAGIC >> 32  # "jWRL": format 2 keeps these 32 bits and puts the checksum in the low ones
CHECKSUM_BLOCK_WORDS = 512          # 4 KiB: the checksum weights each block's word sum by the block's position
_GOLDEN = 0x9E3779B97F4A7C15
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Bits of the `flags` field of a step row.
FLAG_TERMINATED = 1
FLAG_TRUNCATED = 2
FLAG_ENV_FAILED = 4
FLAG_SCREENSHOT_CHANGED = 8
FLAG_HAS_MEMORY = {"memory_chars": 16, "memory_keys": 32, "memory_generic_frac": 64}  # key was given
# The episode was cut: a step outgrew max_seq_len (on every row, like env_failed). A bit no earlier writer set, so
# format 1 and 2 buffers read back with cut=False unchanged and the format version stays 2; a reader older than
# this bit ignores it (it then sees a cut episode as the truncated failure it used to be stored as).
FLAG_CUT = 128


class BufferFormatError(ValueError):
    """The directory is not a (readable) jaxwebrl ring buffer."""


class BufferWriteError(OSError):
    """The machine refused a buffer write (disk full, read-only, quota, permissions); nothing became visible.
    Carries the OSError's errno; str() is one line naming the location and the fix."""


@dataclasses.dataclass(frozen=True)
class BufferConfig:
    """Static shape of a ring buffer; stored as `buffer.json`.

    capacity_steps: step rows in the ring (oldest episodes are overwritten).
    max_seq_len: T, the longest step sequence (prompt + response tokens).
    screenshot_shape: (H, W, 3) uint8 images.
    capacity_screenshots: images in the screenshot ring.
    max_images_per_step: K, the widest `screenshot_refs` row.
    log_capacity: commit records kept (at most one live episode per step, so <= capacity_steps).
    fsync: make each write durable against power loss (off: durable against process crashes only).
    direct_file_io: on the `file` driver, write chunks and control keys from the calling thread with
      POSIX I/O (same keys and bytes; flock for atomic updates) instead of TensorStore's kvstore.
      Stored in buffer.json so that every process of a buffer uses the same locking.
    vocab_size: token ids must be in [0, vocab_size) (0: unknown, ids need only fit int32 and be >= 0).
    checksums: records carry a checksum32 (format 2); False only for buffers written in format 1.
    """

    capacity_steps: int
    max_seq_len: int
    screenshot_shape: tuple[int, int, int]
    capacity_screenshots: int
    max_images_per_step: int = 8
    log_capacity: int = 0
    fsync: bool = False
    direct_file_io: bool = True
    vocab_size: int = 0
    checksums: bool = True

    def __post_init__(self):
        shape = tuple(int(s) for s in self.screenshot_shape)
        object.__setattr__(self, "screenshot_shape", shape)
        if len(shape) != 3 or shape[2] != 3 or min(shape) < 1:
            raise ValueError(f"screenshot_shape must be (H, W, 3) with H, W >= 1, got {shape}")
        for name in ("capacity_steps", "max_seq_len", "capacity_screenshots", "max_images_per_step"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.log_capacity <= 0:
            object.__setattr__(self, "log_capacity", int(self.capacity_steps))
        if not 0 <= int(self.vocab_size) <= INT32_MAX + 1:
            raise ValueError(f"vocab_size must be in [0, 2**31] (0 = unknown), got {self.vocab_size}")

    def to_json(self) -> str:
        body = dataclasses.asdict(self)
        body["screenshot_shape"] = list(self.screenshot_shape)
        return json.dumps({"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "config": body},
                          indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> "BufferConfig":
        """Parses `buffer.json`; a foreign or damaged file raises BufferFormatError naming `where`."""
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BufferFormatError(
                f"{where}/{META_KEY} is not valid JSON ({e}); the buffer metadata is corrupt. "
                f"Restore it or recreate the buffer with RingBuffer.create(..., overwrite=True).") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise BufferFormatError(
                f"{where}/{META_KEY} does not describe a {FORMAT_NAME} ring buffer "
                f"(format={doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}); "
                f"point at a directory made by RingBuffer.create.")
        version = doc.get("format_version")
        if version not in READABLE_VERSIONS:
            raise BufferFormatError(
                f"{where} has buffer format version {version}, this code reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}; recreate the buffer or use a matching jaxwebrl.")
        try:
            fields = dict(doc["config"])
            if version == 1:
                fields["checksums"] = False
            return cls(**fields)
        except (KeyError, TypeError, ValueError) as e:
            raise BufferFormatError(f"{where}/{META_KEY} has a malformed config ({e}); "
                                    f"recreate the buffer with RingBuffer.create.") from None


def row_dtype(config: BufferConfig) -> np.dtype:
    """Structured record of one step row (packed, little-endian); its bytes are one zarr chunk."""
    T, K = config.max_seq_len, config.max_images_per_step
    checksum = [("checksum", "<u4")] if config.checksums else []  # checksum32 of the row with this field zeroed
    return np.dtype([
        ("stamp", "<i8"),            # global step sequence number of the owner; -1 = never written
        ("episode_id", "<i8"),       # global seq of the episode's first step
        ("group_id", "<i8"),
        ("seq_len", "<i4"),          # L_j <= T
        ("step_index", "<i4"),
        ("num_steps", "<i4"),
        ("flags", "<u4"),            # FLAG_* bits
        ("reward", "<f4"),
        ("memory_chars", "<i4"),
        ("memory_keys", "<i4"),
        ("memory_generic_frac", "<f4"),
        *checksum,
        ("screenshot_refs", "<i8", (K,)),
        ("input_ids", "<i4", (T,)),
        ("versions", "<i4", (T,)),
        ("behave_logprobs", "<f4", (T,)),
        ("loss_mask", "i1", (T,)),
    ])


def shot_dtype(config: BufferConfig) -> np.dtype:
    """Structured record of one screenshot: stamp (its global ref), magic, pixels [H, W, 3] uint8."""
    return np.dtype([("stamp", "<i8"), ("magic", "<u8"), ("pixels", "u1", config.screenshot_shape)])


def checksum32(data) -> int:
    """32-bit checksum of a byte buffer, at memory speed (about 10x zlib.crc32 on a 720p screenshot).

    The 64-bit words are summed per 4 KiB block; the block sums are added plain and weighted by block position (so
    a changed, lost or moved block changes it), mixed with the bytes past the last whole word and the length, and
    folded to 32 bits. It detects damage (random bytes, truncation, bit flips, swapped blocks), not tampering.
    """
    raw = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    n = raw.size // 8
    words = raw[:n * 8].view(np.uint64)
    blocks = np.add.reduceat(words, np.arange(0, n, CHECKSUM_BLOCK_WORDS)) if n else np.zeros(0, np.uint64)
    plain = int(blocks.sum(dtype=np.uint64))
    placed = int((blocks * np.arange(1, blocks.size + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    mixed = (plain ^ (placed * _GOLDEN) ^ zlib.crc32(raw[n * 8:].tobytes()) ^ raw.size) % 2**64
    return (mixed ^ (mixed >> 32)) & 0xFFFFFFFF


def row_checksums(rows: np.ndarray) -> np.ndarray:
    """checksum32 of each structured row [n] (format 2) with its `checksum` field zeroed: uint32 [n]."""
    zeroed = np.array(rows, copy=True)
    zeroed["checksum"] = 0
    raw = zeroed.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)
    return np.array([checksum32(r) for r in raw], np.uint32)


def shot_magic(stamp: int, pixels: np.ndarray) -> int:
    """Format-2 screenshot magic: "jWRL" in the high 32 bits, checksum32 of the pixels mixed with the stamp in the
    low ones."""
    mixed = (int(stamp) * _GOLDEN) % 2**64
    return (SHOT_MAGIC_HIGH << 32) | (checksum32(np.ascontiguousarray(pixels)) ^ mixed ^ (mixed >> 32)) & 0xFFFFFFFF
