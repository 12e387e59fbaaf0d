"""Flax Qwen2.5-VL (window attention, chunked M-RoPE, qkv bias) matches transformers; export round-trips."""

import numpy as np
import pytest
import torch

from jaxwebrl.models.hf_io import load_pretrained, save_pretrained
from tests.models import hf_reference as ref


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen2_5_vl_hf")
    model = ref.tiny_qwen2_5_vl(out)
    return model, load_pretrained(str(out), dtype="float32"), str(out)


def test_config_read(pair):
    _, policy, _ = pair
    c = policy.config
    assert c.model_type == "qwen2_5_vl" and c.text.attention_bias and not c.text.qk_norm
    assert not c.text.mrope_interleaved and c.vision.fullatt_block_indexes == (1,)
    assert c.text.rms_norm_eps == 1e-5


def test_vision_tower_with_windows(pair):
    model, policy, _ = pair
    grids = [(1, 6, 10), (1, 4, 4)]  # 3 x 5 merged tokens: windows of 2 x 2, ragged at the edges
    pixels = ref.pixels_for(np.random.RandomState(1), grids, policy.config.vision.patch_dim)
    with torch.no_grad():
        theirs = model.model.visual(torch.as_tensor(pixels), grid_thw=torch.as_tensor(grids)).pooler_output
    mine, deepstack = ref.encode_images(policy, pixels, grids)
    assert deepstack == []
    assert np.abs(np.asarray(mine) - theirs.numpy()).max() <= 1e-5


def test_padded_batch_with_two_images_of_different_sizes(pair):
    model, policy, _ = pair
    rng = np.random.RandomState(2)
    grids = [(1, 6, 10), (1, 4, 4), (1, 8, 6)]
    rows = [ref.image_sequence(rng, grids[:2], lead=1), ref.image_sequence(rng, grids[2:], lead=7)]
    ids, mask = ref.left_pad(rows)
    pixels = ref.pixels_for(rng, grids, policy.config.vision.patch_dim)
    mine = np.asarray(policy.logits(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids))
    theirs = ref.hf_logits(model, ids, mask, pixels, grids)
    assert np.abs(mine - theirs)[mask.astype(bool)].max() <= 1e-4


def test_text_only_logits(pair):
    model, policy, _ = pair
    ids = np.random.RandomState(3).randint(0, 240, (2, 9))
    assert np.abs(np.asarray(policy.logits(ids)) - ref.hf_logits(model, ids)).max() <= 1e-4


def test_export_loads_in_transformers_with_equal_logits(pair, tmp_path):
    from transformers import Qwen2_5_VLForConditionalGeneration

    _, policy, _ = pair
    save_pretrained(policy, str(tmp_path))
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    rng = np.random.RandomState(4)
    grids = [(1, 4, 8)]
    ids = np.asarray([ref.image_sequence(rng, grids)])
    pixels = ref.pixels_for(rng, grids, policy.config.vision.patch_dim)
    mine = np.asarray(policy.logits(ids, pixel_values=pixels, image_grid_thw=grids))
    assert np.abs(mine - ref.hf_logits(model, ids, pixels=pixels, grid=grids)).max() <= 1e-4
