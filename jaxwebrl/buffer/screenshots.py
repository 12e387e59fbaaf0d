"""Screenshot store: uint8 images written once, addressed by a global reference.

A ref is the image's global screenshot sequence number; its slot is `ref % capacity_screenshots`.
Each slot is one zarr chunk that starts with the ref that owns it, so `get` can tell a live image from
one a later lap of the ring has replaced. Pixels travel once (worker -> store); everything else
(policy server requests, step rows, trainer batches) carries refs.
"""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import tensorstore as ts

from jaxwebrl.buffer import storage
from jaxwebrl.buffer.commit import Lease, Reservations
from jaxwebrl.buffer.schema import SHOT_MAGIC, BufferConfig, shot_dtype


class ScreenshotOverwritten(KeyError):
    """The referenced image is no longer in the ring (a later image took its slot)."""


def fingerprint(image: np.ndarray) -> bytes:
    """Cheap identity hint of a uint8 [H, W, 3] image (a strided sample); equality is checked after."""
    flat = image.reshape(-1)
    sample = np.ascontiguousarray(flat[:: max(1, flat.size // 4096)])
    return hashlib.blake2b(sample.tobytes(), digest_size=16).digest()


def dedup_images(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique images of `images` uint8 [N, H, W, 3].

    Returns (keep [U] int64 indices of the first occurrence of each distinct image,
    index_map [N] int64 mapping every input image to its position in `keep`).
    """
    keep: list[int] = []
    by_print: dict[bytes, list[int]] = collections.defaultdict(list)
    index_map = np.empty(len(images), np.int64)
    for i, image in enumerate(images):
        candidates = by_print[fingerprint(image)]
        match = next((u for u in candidates if np.array_equal(images[keep[u]], image)), None)
        if match is None:
            match = len(keep)
            keep.append(i)
            candidates.append(match)
        index_map[i] = match
    return np.asarray(keep, np.int64), index_map


class ScreenshotStore:
    """Put / get images by reference. One instance per process; safe for many processes at once."""

    def __init__(self, array: ts.TensorStore, reservations: Reservations, lease: Lease,
                 config: BufferConfig, *, put_block: int = 16, recent: int = 8):
        self._array = array
        self._reservations = reservations
        self._lease = lease
        self.config = config
        self.capacity = config.capacity_screenshots
        self._dtype = shot_dtype(config)
        self._block = (0, 0)  # [next, end) refs reserved for put() but not used yet
        self._put_block = max(1, min(put_block, self.capacity // 4))
        self._recent: collections.OrderedDict[bytes, tuple[int, np.ndarray]] = collections.OrderedDict()
        self._recent_size = recent

    # -- writing ---------------------------------------------------------------------------------
    def _check_image(self, image) -> np.ndarray:
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.shape != self.config.screenshot_shape:
            raise ValueError(f"screenshot must be uint8 {self.config.screenshot_shape} (the buffer's "
                             f"screenshot_shape), got {image.dtype} {image.shape}; resize the capture or "
                             f"create the buffer with screenshot_shape={image.shape}")
        return image

    def _records(self, images: np.ndarray, refs: np.ndarray) -> np.ndarray:
        """uint8 [n, itemsize] chunk bytes: stamp + magic + pixels."""
        records = np.zeros(len(refs), self._dtype)
        records["stamp"] = refs
        records["magic"] = SHOT_MAGIC
        records["pixels"] = images
        return records.view(np.uint8).reshape(len(refs), self._dtype.itemsize)

    def write_reserved(self, images: np.ndarray, refs: np.ndarray) -> list:
        """Starts writing `images` [n, H, W, 3] at already-reserved `refs` [n]; returns futures."""
        return storage.write_records(self._array, np.asarray(refs) % self.capacity,
                                     self._records(images, np.asarray(refs, np.int64)))

    def put(self, image) -> int:
        """Writes one uint8 [H, W, 3] image (durably) and returns its ref.

        An image identical to one of this process's last few puts returns that put's ref while it is
        still live (unchanged screenshots within an episode share one slot).
        """
        image = self._check_image(image)
        key = fingerprint(image)
        hit = self._recent.get(key)
        if hit is not None and np.array_equal(hit[1], image) and self.is_live([hit[0]])[0]:
            self._recent.move_to_end(key)
            return hit[0]
        if self._block[0] >= self._block[1]:
            _, start = self._reservations.reserve(0, self._put_block)
            self._block = (start, start + self._put_block)
            self._lease.record(shots=[start, start + self._put_block])
        ref = self._block[0]
        self._block = (ref + 1, self._block[1])
        for future in self.write_reserved(image[None], np.asarray([ref])):
            future.result()
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
        """Pixels of `refs` [n] int64 -> uint8 [n, H, W, 3]; raises ScreenshotOverwritten if any is gone."""
        refs = np.asarray(refs, np.int64).reshape(-1)
        if (refs < 0).any():
            raise ValueError(f"screenshot refs must be >= 0 (-1 is padding), got {refs[refs < 0][:4]}")
        raws = storage.read_records(self._array, refs % self.capacity)
        out = np.empty((len(refs),) + self.config.screenshot_shape, np.uint8)
        for i, (ref, raw) in enumerate(zip(refs, raws)):
            record = raw.view(self._dtype)[0]
            if int(record["stamp"]) != ref or int(record["magic"]) != SHOT_MAGIC:
                owner = int(record["stamp"]) if int(record["magic"]) == SHOT_MAGIC else None
                raise ScreenshotOverwritten(
                    f"screenshot ref {ref} is gone: its slot {ref % self.capacity} holds "
                    f"{'ref ' + str(owner) if owner is not None else 'no image'} (the ring keeps the "
                    f"last {self.capacity} images; raise capacity_screenshots or consume episodes sooner)")
            out[i] = record["pixels"]
        return out

    def get(self, ref: int) -> np.ndarray:
        """Pixels of one ref -> uint8 [H, W, 3]."""
        return self.get_many([ref])[0]
