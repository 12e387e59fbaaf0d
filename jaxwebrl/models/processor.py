"""Qwen-VL image processor and the chat processor (template + tokenizer + images), in NumPy/PIL.

`ImageProcessor` reproduces transformers' `Qwen2VLImageProcessorPil` (which Qwen2.5-VL and Qwen3-VL both use)
bit for bit: `smart_resize` to multiples of patch × merge within [min_pixels, max_pixels], PIL bicubic resize of
the uint8 image, rescale in float64 then cast to float32, per-channel normalise in float32, the single frame
repeated `temporal_patch_size` times, and patches flattened in HF's order — merge windows row-major, the
merge × merge patches of a window row-major inside it, each patch as (C, T, ps, ps) flattened.

`Processor(messages, images)` renders the chat template, tokenises, and expands every `<|image_pad|>` into
t·h·w / merge² copies for its image, exactly as transformers' `Qwen3VLProcessor` / `Qwen2_5_VLProcessor`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from jaxwebrl.models.tokenizer import Tokenizer, VisionTokenIds, tiny_tokenizer

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_PIL_BICUBIC = 3


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept.

    Same arithmetic as transformers' `smart_resize` (round to the nearest multiple; if the area is too large,
    floor after scaling down; if too small, ceil after scaling up).
    """
    if min(height, width) <= 0:
        raise ValueError(f"image has an empty side: height={height}, width={width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)} "
            f"for a {height}x{width} image: crop or pad it first"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
    """Settings of a Qwen-VL image processor (the fields of `preprocessor_config.json`).

    Defaults are transformers' `Qwen2VLImageProcessor` defaults; `qwen3_vl()` and `qwen2_5_vl()` give the
    settings the released checkpoints ship.
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = _PIL_BICUBIC

    @classmethod
    def qwen3_vl(cls) -> "ImageProcessorConfig":
        return cls(patch_size=16, min_pixels=65536, max_pixels=16777216, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)

    @classmethod
    def qwen2_5_vl(cls) -> "ImageProcessorConfig":
        return cls(patch_size=14, min_pixels=3136, max_pixels=12845056)

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this: patch_size × merge_size."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Width of one row of `pixel_values`: 3 · temporal_patch_size · patch_size²."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "ImageProcessorConfig":
        """From a `preprocessor_config.json` dict; `min_pixels`/`max_pixels` win over `size`, as in transformers."""
        defaults = cls()
        size = config.get("size") or {}
        min_pixels = config.get("min_pixels", size.get("shortest_edge", size.get("min_pixels", defaults.min_pixels)))
        max_pixels = config.get("max_pixels", size.get("longest_edge", size.get("max_pixels", defaults.max_pixels)))
        unsupported = [k for k in ("do_center_crop", "do_pad") if config.get(k)]
        if unsupported:
            raise ValueError(f"preprocessor_config.json sets {unsupported}, which Qwen-VL processors do not support")
        return cls(
            patch_size=int(config.get("patch_size", defaults.patch_size)),
            temporal_patch_size=int(config.get("temporal_patch_size", defaults.temporal_patch_size)),
            merge_size=int(config.get("merge_size", defaults.merge_size)),
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            image_mean=tuple(float(x) for x in config.get("image_mean", defaults.image_mean)),
            image_std=tuple(float(x) for x in config.get("image_std", defaults.image_std)),
            rescale_factor=float(config.get("rescale_factor", defaults.rescale_factor)),
            do_resize=bool(config.get("do_resize", True)),
            do_rescale=bool(config.get("do_rescale", True)),
            do_normalize=bool(config.get("do_normalize", True)),
            resample=int(config.get("resample", _PIL_BICUBIC)),
        )

    def to_dict(self) -> dict[str, Any]:
        """A `preprocessor_config.json` dict that transformers' Qwen2VLImageProcessor loads to the same settings."""
        return {
            "image_processor_type": "Qwen2VLImageProcessor",
            "size": {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "rescale_factor": self.rescale_factor,
            "do_resize": self.do_resize,
            "do_rescale": self.do_rescale,
            "do_normalize": self.do_normalize,
            "do_convert_rgb": True,
            "resample": self.resample,
        }


def _as_rgb_uint8(image: Any) -> np.ndarray:
    """A PIL image or uint8 `[H, W, 3]` / `[H, W]` / `[H, W, 4]` array -> uint8 `[H, W, 3]` (PIL's RGB conversion)."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise TypeError(
            f"images must be uint8 [H, W, 3] arrays (or PIL images), got dtype {array.dtype}: "
            "convert with (x * 255).round().clip(0, 255).astype(np.uint8)"
        )
    if array.ndim == 3 and array.shape[-1] == 3:
        return array
    if array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in (1, 4)):
        single = array.squeeze(-1) if array.ndim == 3 and array.shape[-1] == 1 else array
        return np.asarray(Image.fromarray(single).convert("RGB"))
    raise ValueError(f"images must be [H, W, 3] (channels last), got shape {array.shape}")


class ImageProcessor:
    """Images -> (pixel_values `[P, 3·T·ps·ps] float32`, image_grid_thw `[n, 3] int32`), equal to transformers'."""

    def __init__(self, config: ImageProcessorConfig | None = None):
        self.config = config or ImageProcessorConfig()

    def grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) patch grid of one `height × width` image."""
        c = self.config
        if c.do_resize:
            height, width = smart_resize(height, width, c.factor, c.min_pixels, c.max_pixels)
        elif height % c.factor or width % c.factor:
            raise ValueError(f"with do_resize=False, image sides must be multiples of {c.factor}, got {height}x{width}")
        return 1, height // c.patch_size, width // c.patch_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """Number of `<|image_pad|>` tokens one `height × width` image takes in the prompt."""
        t, h, w = self.grid_thw(height, width)
        return t * h * w // (self.config.merge_size**2)

    def normalized_pixels(self, image: Any) -> np.ndarray:
        """One image -> resized, rescaled, normalised `[3, H', W'] float32` (channels first)."""
        from PIL import Image

        c = self.config
        rgb = _as_rgb_uint8(image)
        _, grid_h, grid_w = self.grid_thw(*rgb.shape[:2])
        if c.do_resize:
            resized = Image.fromarray(rgb).resize((grid_w * c.patch_size, grid_h * c.patch_size), resample=c.resample)
            rgb = np.asarray(resized)
        pixels = np.moveaxis(rgb, -1, 0)
        if c.do_rescale:  # transformers upcasts to float64 before scaling, then casts to float32
            pixels = (pixels.astype(np.float64) * c.rescale_factor).astype(np.float32)
        else:
            pixels = pixels.astype(np.float32)
        if c.do_normalize:
            mean = np.asarray(c.image_mean, dtype=np.float32)[:, None, None]
            std = np.asarray(c.image_std, dtype=np.float32)[:, None, None]
            pixels = (pixels - mean) / std
        return pixels

    def patchify(self, pixels: np.ndarray) -> np.ndarray:
        """`[3, H, W] float32` -> `[H/ps · W/ps, 3·T·ps·ps] float32` in HF's patch order (frame repeated T times)."""
        c = self.config
        channels, height, width = pixels.shape
        gh, gw, m, ps = height // c.patch_size, width // c.patch_size, c.merge_size, c.patch_size
        patches = pixels.reshape(channels, gh // m, m, ps, gw // m, m, ps)
        patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, ps, ps)
        patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], c.temporal_patch_size, ps, ps))
        return np.ascontiguousarray(patches.reshape(gh * gw, channels * c.temporal_patch_size * ps * ps))

    def __call__(self, images: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Images (uint8 `[H, W, 3]` or PIL) -> pixel_values `[P, patch_dim] float32`, image_grid_thw `[n, 3] int32`."""
        rows, grids = [], []
        for image in images:
            pixels = self.normalized_pixels(image)
            rows.append(self.patchify(pixels))
            grids.append((1, pixels.shape[1] // self.config.patch_size, pixels.shape[2] // self.config.patch_size))
        if not rows:
            return np.zeros((0, self.config.patch_dim), np.float32), np.zeros((0, 3), np.int32)
        return np.concatenate(rows, axis=0), np.asarray(grids, dtype=np.int32)


class Processor:
    """Chat messages + images -> model inputs, equal to transformers' Qwen-VL processors.

    `processor(messages, images)` returns dict(input_ids `[L] int32`, pixel_values `[P, patch_dim] float32`,
    image_grid_thw `[n, 3] int32`); the i-th `{"type": "image"}` part of `messages` is `images[i]`.
    """

    def __init__(self, tokenizer: Tokenizer, image_processor: ImageProcessor):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.vision_ids = VisionTokenIds.of(tokenizer)

    @classmethod
    def from_pretrained(cls, hf_dir: str) -> "Processor":
        """Tokenizer, chat template and `preprocessor_config.json` of a Hugging Face checkpoint directory."""
        path = os.path.join(hf_dir, "preprocessor_config.json")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found: Qwen-VL checkpoints ship their image-processor settings there "
                "(write ImageProcessorConfig.qwen3_vl().to_dict() to it if yours lacks it)"
            )
        with open(path, encoding="utf-8") as f:
            config = ImageProcessorConfig.from_dict(json.load(f))
        return cls(Tokenizer.from_pretrained(hf_dir), ImageProcessor(config))

    def save_pretrained(self, out_dir: str) -> None:
        """Writes the tokenizer files and `preprocessor_config.json` (transformers' AutoProcessor layout)."""
        self.tokenizer.save_pretrained(out_dir)
        with open(os.path.join(out_dir, "preprocessor_config.json"), "w", encoding="utf-8") as f:
            json.dump(self.image_processor.config.to_dict(), f, indent=2)

    @property
    def image_token_id(self) -> int:
        return self.vision_ids.image_pad

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **template_kwargs) -> str:
        """The chat template's text, with one `<|image_pad|>` per image (before expansion)."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **template_kwargs)

    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        images: Sequence[Any] = (),
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> dict[str, np.ndarray]:
        """Messages + images -> dict(input_ids `[L] int32`, pixel_values `[P, patch_dim] float32`,
        image_grid_thw `[n, 3] int32`).

        `add_generation_prompt=True` (the default) ends the prompt with the assistant header, ready to sample.
        """
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **template_kwargs)
        return self.encode(text, images)

    def encode(self, text: str, images: Sequence[Any] = ()) -> dict[str, np.ndarray]:
        """Already-rendered `text` (one `<|image_pad|>` per image) + images -> the same dict as `__call__`."""
        ids = self.tokenizer.encode(text)
        pixel_values, image_grid_thw = self.image_processor(images)
        is_pad = ids == self.vision_ids.image_pad
        if int(is_pad.sum()) != len(images):
            raise ValueError(
                f"the prompt has {int(is_pad.sum())} image placeholders but {len(images)} images were given: "
                "pass exactly one image per {'type': 'image'} content part, in order"
            )
        repeats = np.ones(ids.shape, np.int64)
        merge_area = self.image_processor.config.merge_size**2
        repeats[is_pad] = np.prod(image_grid_thw, axis=1) // merge_area
        return {
            "input_ids": np.repeat(ids, repeats).astype(np.int32),
            "pixel_values": pixel_values,
            "image_grid_thw": image_grid_thw,
        }

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def tiny_processor(patch_size: int = 14, temporal_patch_size: int = 2, merge_size: int = 2,
                   min_pixels: int | None = None, max_pixels: int | None = None) -> Processor:
    """Processor of the `tiny` preset: `tiny_tokenizer()` and Qwen3-VL normalisation at the model's patch size.

    Screenshots are scaled to at most `max_pixels` (default 16 merge windows a side, so ≤ 256 image tokens).
    """
    factor = patch_size * merge_size
    config = ImageProcessorConfig(
        patch_size=patch_size,
        temporal_patch_size=temporal_patch_size,
        merge_size=merge_size,
        min_pixels=factor * factor * 4 if min_pixels is None else min_pixels,
        max_pixels=factor * factor * 256 if max_pixels is None else max_pixels,
        image_mean=(0.5,) * 3,
        image_std=(0.5,) * 3,
    )
    return Processor(tiny_tokenizer(), ImageProcessor(config))
