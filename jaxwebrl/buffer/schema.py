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

Every record carries a 32-bit checksum (rows: a `checksum` field over the row with that field zeroed; screenshots:
the low 32 bits of the header's magic, over stamp + pixels), so a reader tells a record a later writer replaced
(valid checksum, newer stamp of the same slot) from one damaged on disk. The checksum is the format's:
- format 3: CRC-32 (`crc32_checksum`): catches every 1- and 2-bit error and every burst of up to 32 bits in a record;
- format 2: a sum of 64-bit words per 4 KiB block (`block_sum_checksum`), which misses a bit set in one word and the
  same bit cleared in another word of the block, and a single flip of a word's top two bits in every other block.
  Format-2 buffers are still read, and written, with it: a resumed run keeps its buffer (the old check still
  catches random bytes, truncation and most single flips);
- format 1: none; records are only stamp-checked.
New buffers are format 3.
"""

from __future__ import annotations

import dataclasses
import json
import zlib

import numpy as np

FORMAT_NAME = "jaxwebrl.buffer"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # 1: no record checksums; 2: block sums; 3: CRC-32
META_KEY = "buffer.json"
CREATING_KEY = "creating.json"  # written first by `create`, removed after META_KEY: a creation that did not finish
TRAINER_LOCK_KEY = "trainer.lock"  # the owning training run's flock (owner.py); not buffer data
SHOT_MAGIC = 0x6A57524C53484F54  # "jWRLSHOT": format 1 screenshot header
SHOT_MAGIC_HIGH = SHOT_MAGIC >> 32  # "jWRL": formats 2 and 3 keep these 32 bits, the checksum in the low ones
CHECKSUM_BLOCK_WORDS = 512          # 4 KiB: format 2's checksum weights each block's word sum by its position
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
# format 1 and 2 buffers read back with cut=False unchanged (it took no new format version); a reader older than
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
    format_version: the on-disk format (FORMAT_VERSION for a new buffer; an older buffer keeps its own, which
      decides its rows' layout and checksum: see the module docstring). Stored at the top of buffer.json.
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
    format_version: int = FORMAT_VERSION

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
        if self.format_version not in READABLE_VERSIONS:
            raise ValueError(f"format_version must be one of {READABLE_VERSIONS}, got {self.format_version}")

    @property
    def checksums(self) -> bool:
        """Records carry a checksum (formats 2 and 3)."""
        return self.format_version >= 2

    def to_json(self) -> str:
        body = dataclasses.asdict(self)
        body["screenshot_shape"] = list(self.screenshot_shape)
        version = body.pop("format_version")
        if version == 2:
            body["checksums"] = True   # as format 2 wrote it
        return json.dumps({"format": FORMAT_NAME, "format_version": version, "config": body},
                          indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> "BufferConfig":
        """Parses `buffer.json`; a foreign or damaged file raises BufferFormatError naming `where`."""
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BufferFormatError(
                f"{where}/{META_KEY} is not valid JSON ({e}); the buffer metadata is corrupt. "
                f"Restore it, or start the run on a new buffer (--config.buffer.path; RingBuffer.create(..., "
                f"overwrite=True) erases this one).") from None
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
            if version == 2:
                del fields["checksums"]   # always true in format 2
            return cls(**fields, format_version=version)
        except (KeyError, TypeError, ValueError) as e:
            raise BufferFormatError(f"{where}/{META_KEY} has a malformed config ({e}); "
                                    f"recreate the buffer with RingBuffer.create.") from None


def row_dtype(config: BufferConfig) -> np.dtype:
    """Structured record of one step row (packed, little-endian); its bytes are one zarr chunk."""
    T, K = config.max_seq_len, config.max_images_per_step
    checksum = [("checksum", "<u4")] if config.checksums else []  # of the row with this field zeroed
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


def crc32_checksum(records: np.ndarray) -> np.ndarray:
    """Format 3: CRC-32 (zlib's, one C call per record) of each record of uint8 [n, L] (rows C-contiguous):
    uint32 [n]."""
    return np.fromiter((zlib.crc32(record) for record in records), np.uint32, len(records))


def block_sum_checksum(data) -> int:
    """Format 2's 32-bit checksum of a byte buffer (read and written only in format-2 buffers).

    The 64-bit words are summed per 4 KiB block; the block sums are added plain and weighted by block position, mixed
    with the bytes past the last whole word and the length, and folded to 32 bits. A sum, so it misses a bit set in
    one word and the same bit cleared in another word of the same block, and (the plain and weighted sums cancel
    there) a single flip of bit 62 or 63 of a word in an odd-numbered block; format 3's CRC-32 misses neither.
    """
    raw = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    n = raw.size // 8
    words = raw[:n * 8].view(np.uint64)
    blocks = np.add.reduceat(words, np.arange(0, n, CHECKSUM_BLOCK_WORDS)) if n else np.zeros(0, np.uint64)
    plain = int(blocks.sum(dtype=np.uint64))
    placed = int((blocks * np.arange(1, blocks.size + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    mixed = (plain ^ (placed * _GOLDEN) ^ zlib.crc32(raw[n * 8:].tobytes()) ^ raw.size) % 2**64
    return (mixed ^ (mixed >> 32)) & 0xFFFFFFFF


def row_checksums(rows: np.ndarray, config: BufferConfig) -> np.ndarray:
    """The checksum (config's format) of each structured row [n] with its `checksum` field zeroed: uint32 [n]."""
    zeroed = np.array(rows, copy=True)
    zeroed["checksum"] = 0
    raw = zeroed.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)
    if config.format_version >= 3:
        return crc32_checksum(raw)
    return np.array([block_sum_checksum(r) for r in raw], np.uint32)


def shot_magic(stamp: int, pixels: np.ndarray, config: BufferConfig) -> int:
    """Screenshot magic (formats 2 and 3): "jWRL" in the high 32 bits, the checksum of stamp and pixels (the config's
    format) in the low ones."""
    pixels = np.ascontiguousarray(pixels)
    if config.format_version >= 3:
        low = zlib.crc32(pixels, zlib.crc32(np.int64(stamp).astype("<i8").tobytes()))
    else:
        mixed = (int(stamp) * _GOLDEN) % 2**64
        low = (block_sum_checksum(pixels) ^ mixed ^ (mixed >> 32)) & 0xFFFFFFFF
    return (SHOT_MAGIC_HIGH << 32) | low
