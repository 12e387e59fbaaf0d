"""Image processor and chat processor: equal to transformers' Qwen-VL processors, element for element."""

import numpy as np
import pytest

from jaxwebrl.models.processor import (
    ImageProcessor,
    ImageProcessorConfig,
    Processor,
    smart_resize,
    tiny_processor,
)

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402

# (height, width): odd sizes, exact multiples, extreme aspect ratios, below min_pixels, above max_pixels.
IMAGE_SIZES = [(37, 91), (224, 224), (100, 700), (1000, 1500), (30, 20), (57, 2000)]


def _random_image(rng, height, width):
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def _hf_image_processor(config: ImageProcessorConfig):
    return Qwen2VLImageProcessorPil(
        patch_size=config.patch_size,
        temporal_patch_size=config.temporal_patch_size,
        merge_size=config.merge_size,
        size={"shortest_edge": config.min_pixels, "longest_edge": config.max_pixels},
        image_mean=list(config.image_mean),
        image_std=list(config.image_std),
    )


CONFIGS = {
    "qwen2_vl_defaults": ImageProcessorConfig(),
    "qwen3_vl": ImageProcessorConfig.qwen3_vl(),
    "tight_limits": ImageProcessorConfig(patch_size=8, merge_size=2, min_pixels=64 * 64, max_pixels=128 * 128),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_image_processor_equals_transformers(name):
    config = CONFIGS[name]
    ours, hf = ImageProcessor(config), _hf_image_processor(config)
    rng = np.random.default_rng(0)
    for height, width in IMAGE_SIZES:
        image = _random_image(rng, height, width)
        expected = hf(images=[image], return_tensors="np")
        pixel_values, grid = ours([image])
        assert pixel_values.dtype == np.float32 and grid.dtype == np.int32
        np.testing.assert_array_equal(grid, expected["image_grid_thw"])
        np.testing.assert_array_equal(pixel_values, expected["pixel_values"])  # bit-identical
        t, h, w = grid[0]
        assert pixel_values.shape == (t * h * w, config.patch_dim)
        assert h * w * config.patch_size**2 <= max(config.max_pixels, config.factor**2)
        assert ours.num_image_tokens(height, width) == t * h * w // config.merge_size**2


def test_several_images_concatenate_in_order():
    config = CONFIGS["tight_limits"]
    ours, hf = ImageProcessor(config), _hf_image_processor(config)
    rng = np.random.default_rng(1)
    images = [_random_image(rng, h, w) for h, w in [(50, 90), (200, 130), (64, 64)]]
    expected = hf(images=images, return_tensors="np")
    pixel_values, grid = ours(images)
    np.testing.assert_array_equal(grid, expected["image_grid_thw"])
    np.testing.assert_array_equal(pixel_values, expected["pixel_values"])
    empty_values, empty_grid = ours([])
    assert empty_values.shape == (0, config.patch_dim) and empty_grid.shape == (0, 3)


def test_pil_and_grayscale_inputs():
    from PIL import Image

    ours = ImageProcessor(CONFIGS["tight_limits"])
    rng = np.random.default_rng(2)
    rgb = _random_image(rng, 70, 120)
    np.testing.assert_array_equal(ours([Image.fromarray(rgb)])[0], ours([rgb])[0])
    gray = rng.integers(0, 256, (70, 120), dtype=np.uint8)
    np.testing.assert_array_equal(ours([gray])[0], ours([np.repeat(gray[..., None], 3, axis=-1)])[0])
    with pytest.raises(TypeError, match="uint8"):
        ours([rgb.astype(np.float32)])
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 3000, 28, 56 * 56, 28 * 28 * 1280)


def test_patch_order_is_merge_window_major():
    """Rows of a merge window are consecutive; each row holds (C, T, ps, ps) with the frame repeated T times."""
    config = ImageProcessorConfig(patch_size=2, merge_size=2, temporal_patch_size=2, do_resize=False,
                                  do_normalize=False, do_rescale=False)
    ours = ImageProcessor(config)
    image = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    pixel_values, grid = ours([image])
    assert grid.tolist() == [[1, 4, 4]]
    rows = pixel_values.reshape(16, 3, 2, 2, 2)  # [patches, C, T, ps, ps]
    np.testing.assert_array_equal(rows[:, :, 0], rows[:, :, 1])
    # Second row: second patch of the first 2x2 merge window = image rows 0-1, columns 2-3.
    np.testing.assert_array_equal(rows[1, :, 0], np.moveaxis(image[0:2, 2:4], -1, 0))
    # Third row: the window's bottom-left patch = image rows 2-3, columns 0-1.
    np.testing.assert_array_equal(rows[2, :, 0], np.moveaxis(image[2:4, 0:2], -1, 0))
    # Fifth row: first patch of the second window = image rows 0-1, columns 4-5.
    np.testing.assert_array_equal(rows[4, :, 0], np.moveaxis(image[0:2, 4:6], -1, 0))


def test_config_roundtrips_through_transformers(tmp_path):
    processor = tiny_processor(patch_size=16)
    processor.save_pretrained(str(tmp_path))
    hf = Qwen2VLImageProcessorPil.from_pretrained(str(tmp_path))
    loaded = Processor.from_pretrained(str(tmp_path))
    assert loaded.image_processor.config == processor.image_processor.config
    image = _random_image(np.random.default_rng(3), 123, 321)
    np.testing.assert_array_equal(loaded.image_processor([image])[0], hf(images=[image], return_tensors="np")["pixel_values"])
    # Released checkpoints write min/max pixels either as `size` or as top-level keys (the latter win).
    legacy = ImageProcessorConfig.from_dict({"min_pixels": 3136, "max_pixels": 12845056, "size": {"shortest_edge": 1},
                                             "patch_size": 14})
    assert legacy == ImageProcessorConfig.qwen2_5_vl()


def _hf_qwen3_vl_processor(hf_dir):
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        """transformers' processor without its video half (which needs torchvision, absent here)."""

        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(hf_dir)
    return ImageOnlyQwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                                     chat_template=tokenizer.chat_template)


def test_processor_equals_transformers_qwen3_vl_processor(tmp_path):
    tiny_processor(patch_size=16).save_pretrained(str(tmp_path))
    ours, hf = Processor.from_pretrained(str(tmp_path)), _hf_qwen3_vl_processor(str(tmp_path))
    rng = np.random.default_rng(4)
    images = [_random_image(rng, 60, 90), _random_image(rng, 300, 200), _random_image(rng, 1000, 1700)]
    conversations = [
        ([{"role": "user", "content": "no image here"}], []),
        ([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "click OK"}]}], images[:1]),
        ([{"role": "system", "content": "agent"},
          {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "image"}]},
          {"role": "assistant", "content": "click(2)"},
          {"role": "user", "content": [{"type": "image"}]}], images),
    ]
    for messages, imgs in conversations:
        text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        expected = hf(text=[text], images=imgs or None, return_tensors="np")
        batch = ours(messages, imgs)
        assert batch["input_ids"].dtype == np.int32
        np.testing.assert_array_equal(batch["input_ids"], expected["input_ids"][0])
        if imgs:
            np.testing.assert_array_equal(batch["pixel_values"], expected["pixel_values"])
            np.testing.assert_array_equal(batch["image_grid_thw"], expected["image_grid_thw"])
        n_pad = int((batch["input_ids"] == ours.image_token_id).sum())
        assert n_pad == sum(ours.image_processor.num_image_tokens(*im.shape[:2]) for im in imgs)


def test_placeholder_image_count_mismatch_is_an_error():
    processor = tiny_processor()
    image = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(ValueError, match="1 image placeholders but 2 images"):
        processor([{"role": "user", "content": [{"type": "image"}]}], [image, image])
