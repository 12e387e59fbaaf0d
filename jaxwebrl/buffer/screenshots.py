"""Screenshot store: uint8 images written once, addressed by a global reference.

A ref is the image's global screenshot sequence number; its slot is `ref % capacity_screenshots`.
Each slot is one zarr chunk that starts with the ref that owns it, so `get` can tell a live image from
one a later lap of the ring has replaced. Pixels travel once (worker -> store); everything else
(policy server requests, step rows, trainer batches) carries refs.
"""

from __future__ import annotations

import collections
import hashlib
import threading

import numpy as np

from jaxwebrl.buffer import integrity
from jaxwebrl.buffer.commit import Lease, Reservations
from jaxwebrl.buffer.storage import RecordArray, writing
from jaxwebrl.buffer.schema import SHOT_MAGIC, BufferConfig, shot_magic


class ScreenshotOverwritten(KeyError):
    """The referenced image is no longer in the ring (a later image took its slot)."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ScreenshotCorrupt(ScreenshotOverwritten):
    """The referenced image's chunk fails its checksum or is unreadable (damaged on disk): it is gone too."""


def fingerprint(image: np.ndarray) -> bytes:
    """Cheap identity hint of a uint8 [H, W, 3] image (a strided sample); equality is checked after."""
    flat = image.reshape(-1)
    sample = np.ascontiguousarray(flat[:: max(1, flat.size // 4096)])
    return hashlib.blake2b(sample.tobytes(), digest_size=16).digest()


def dedup_images(images: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct images among images[candidates] (images uint8 [N, H, W, 3], candidates [n] int64); no copies.

    Returns (keep [U] int64 positions in `candidates` of each distinct image's first occurrence,
    index_map [n] int64 mapping every candidate to its position in `keep`).
    """
    keep: list[int] = []
    by_print: dict[bytes, list[int]] = collections.defaultdict(list)
    index_map = np.empty(len(candidates), np.int64)
    for i, c in enumerate(candidates):
        image = images[c]
        matches = by_print[fingerprint(image)]
        match = next((u for u in matches if np.array_equal(images[candidates[keep[u]]], image)), None)
        if match is None:
            match = len(keep)
            keep.append(i)
            matches.append(match)
        index_map[i] = match
    return np.asarray(keep, np.int64), index_map


class ScreenshotStore:
    """Put / get images by reference. One instance per process; safe for many processes at once."""

    def __init__(self, array: RecordArray, reservations: Reservations, lease: Lease,
                 config: BufferConfig, *, put_block: int = 16, recent: int = 8):
        self._array = array
        self._reservations = reservations
        self._lease = lease
        self.config = config
        self.capacity = config.capacity_screenshots
        self._block = (0, 0)  # [next, end) refs reserved for put() but not used yet
        self._put_block = max(1, min(put_block, self.capacity // 4))
        self._recent: collections.OrderedDict[bytes, tuple[int, np.ndarray]] = collections.OrderedDict()
        self._recent_size = recent
        self._lock = threading.Lock()

    # -- writing ---------------------------------------------------------------------------------
    def _check_image(self, image) -> np.ndarray:
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.shape != self.config.screenshot_shape:
            raise ValueError(f"screenshot must be uint8 {self.config.screenshot_shape} (the buffer's "
                             f"screenshot_shape), got {image.dtype} {image.shape}; resize the capture or "
                             f"create the buffer with screenshot_shape={image.shape}")
        return image

    def write_reserved(self, images: np.ndarray, refs, index=None) -> None:
        """Writes images[index] (uint8 [N, H, W, 3], index [n] or all) at already-reserved `refs` [n], durably.

        Each image becomes one chunk: a 16-byte header (stamp = its ref, magic with the checksum of stamp
        and pixels) followed by the pixels.
        """
        refs = np.asarray(refs, np.int64)
        index = np.arange(len(refs)) if index is None else np.asarray(index)
        for ref, i in zip(refs, index):
            pixels = np.ascontiguousarray(images[i])
            magic = shot_magic(int(ref), pixels, self.config) if self.config.checksums else SHOT_MAGIC
            header = np.array([ref, magic], "<i8")  # stamp, magic (< 2**63)
            self._array.write(int(ref) % self.capacity, [header, pixels])

    def put(self, image) -> int:
        """Writes one uint8 [H, W, 3] image (durably) and returns its ref.

        An image identical to one of this process's last few puts returns that put's ref while it is
        still live (unchanged screenshots within an episode share one slot). Raises BufferWriteError when the
        machine refuses the write (disk full, read-only).
        """
        with writing(self._array.where):
            return self._put(self._check_image(image))

    def _put(self, image: np.ndarray) -> int:
        """put() of a checked image."""
        key = fingerprint(image)
        with self._lock:  # puts may come from several threads (e.g. one per browser)
            hit = self._recent.get(key)
            if hit is not None and np.array_equal(hit[1], image) and self.is_live([hit[0]])[0]:
                self._recent.move_to_end(key)
                return hit[0]
            # A block reserved before this process waited may have been lapped by other writers' puts: its refs
            # would overwrite newer images of their slots (and be refused by append as not live): take a new block.
            if self._block[0] >= self._block[1] or not self.is_live([self._block[0]])[0]:
                _, start = self._reservations.reserve(0, self._put_block)
                self._block = (start, start + self._put_block)
                self._lease.record(shots=[start, start + self._put_block])
            ref = self._block[0]
            self._block = (ref + 1, self._block[1])
        self.write_reserved(image[None], [ref])
        with self._lock:
            self._recent[key] = (ref, image.copy())
            if len(self._recent) > self._recent_size:
                self._recent.popitem(last=False)
        return ref

    # -- reading ---------------------------------------------------------------------------------
    def is_live(self, refs, heads: dict | None = None) -> np.ndarray:
        """bool [n]: the ref has been reserved and no later lap has reserved its slot yet."""
        refs = np.asarray(refs, np.int64)
        shots_head = (heads or self._reservations.heads())["shots"]
        return (refs >= 0) & (refs < shots_head) & (refs + self.capacity >= shots_head)

    def get_many(self, refs) -> np.ndarray:
        """Pixels of `refs` [n] int64 -> uint8 [n, H, W, 3]; raises ScreenshotOverwritten if any is gone
        (ScreenshotCorrupt, a subclass, when its chunk is damaged)."""
        refs = np.asarray(refs, np.int64).reshape(-1)
        if (refs < 0).any():
            raise ValueError(f"screenshot refs must be >= 0 (-1 is padding), got {refs[refs < 0][:4]}")
        out = np.empty((len(refs),) + self.config.screenshot_shape, np.uint8)
        header = np.empty(2, "<i8")  # stamp, magic
        for i, ref in enumerate(refs):
            slot = int(ref) % self.capacity
            whole = self._array.read_into(slot, [header, out[i]])
            stamp, magic = int(header[0]), int(header[1])
            status = integrity.shot_status(int(ref), stamp, magic, out[i], self.config)
            if not whole or status == integrity.CORRUPT:
                raise ScreenshotCorrupt(
                    f"screenshot ref {ref} is corrupt: the chunk of slot {slot} is "
                    f"{'short' if not whole else 'damaged (checksum mismatch)'} under {self._array.where}; "
                    f"the episodes that show it cannot be trained (run python -m jaxwebrl.buffer.inspect)")
            if status == integrity.OVERWRITTEN:
                owner = "no image" if stamp == 0 and magic == 0 else f"ref {stamp}"
                raise ScreenshotOverwritten(
                    f"screenshot ref {ref} is gone: its slot {ref % self.capacity} holds {owner} (the ring "
                    f"keeps the last {self.capacity} images; raise capacity_screenshots or consume episodes sooner)")
        return out

    def get(self, ref: int) -> np.ndarray:
        """Pixels of one ref -> uint8 [H, W, 3]."""
        return self.get_many([ref])[0]
