"""Flax Qwen3-VL loaded from a transformers checkpoint matches transformers' fp32 logits."""

import numpy as np
import pytest
import torch

from jaxwebrl.models.hf_io import load_pretrained
from tests.models import hf_reference as ref

TOL = 1e-4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen3_vl_hf")
    model = ref.tiny_qwen3_vl(out)
    return model, load_pretrained(str(out), dtype="float32"), str(out)


def _max_diff(a, b, mask=None):
    diff = np.abs(np.asarray(a) - np.asarray(b))
    return float(diff[np.asarray(mask).astype(bool)].max() if mask is not None else diff.max())


def test_config_read(pair):
    _, policy, _ = pair
    c = policy.config
    assert (c.model_type, c.text.num_layers, c.text.num_kv_heads, c.text.mrope_section) == ("qwen3_vl", 3, 2, (2, 3, 3))
    assert c.vision.deepstack_visual_indexes == (0, 1) and not c.tie_word_embeddings


def test_text_only_logits(pair):
    model, policy, _ = pair
    ids = np.random.RandomState(0).randint(0, 240, (2, 11))
    assert _max_diff(policy.logits(ids), ref.hf_logits(model, ids)) <= TOL


def test_vision_tower_and_deepstack_features(pair):
    model, policy, _ = pair
    grids = [(1, 4, 6), (1, 6, 2)]
    pixels = ref.pixels_for(np.random.RandomState(1), grids, policy.config.vision.patch_dim)
    with torch.no_grad():
        out = model.model.visual(torch.as_tensor(pixels), grid_thw=torch.as_tensor(grids))
    embeds, deepstack = ref.encode_images(policy, pixels, grids)
    assert _max_diff(embeds, out.pooler_output.numpy()) <= 1e-5
    assert len(deepstack) == 2
    for mine, theirs in zip(deepstack, out.deepstack_features):
        assert _max_diff(mine, theirs.numpy()) <= 1e-5


def test_rope_index_matches_transformers(pair):
    model, policy, _ = pair
    rng = np.random.RandomState(2)
    grids = [(1, 4, 6), (1, 2, 2), (1, 6, 4)]
    ids, mask = ref.left_pad([ref.image_sequence(rng, grids[:2]), ref.image_sequence(rng, grids[2:], lead=2)])
    theirs, theirs_delta = model.model.get_rope_index(
        torch.as_tensor(ids),
        mm_token_type_ids=torch.as_tensor((ids == ref.IMAGE_TOKEN).astype(np.int64)),
        image_grid_thw=torch.as_tensor(grids),
        attention_mask=torch.as_tensor(mask),
    )
    mine, mine_delta = policy.get_rope_index(ids, np.asarray(grids), mask)
    real = mask.astype(bool)
    np.testing.assert_array_equal(np.asarray(mine)[:, real], theirs.numpy()[:, real])
    np.testing.assert_array_equal(np.asarray(mine_delta), theirs_delta.numpy().reshape(-1))


def test_one_image_logits(pair):
    model, policy, _ = pair
    rng = np.random.RandomState(3)
    grids = [(1, 4, 6)]
    ids = np.asarray([ref.image_sequence(rng, grids)])
    pixels = ref.pixels_for(rng, grids, policy.config.vision.patch_dim)
    mine = policy.logits(ids, pixel_values=pixels, image_grid_thw=grids)
    assert _max_diff(mine, ref.hf_logits(model, ids, pixels=pixels, grid=grids)) <= TOL


def test_two_images_of_different_sizes_logits(pair):
    model, policy, _ = pair
    rng = np.random.RandomState(4)
    grids = [(1, 4, 6), (1, 8, 4)]
    ids = np.asarray([ref.image_sequence(rng, grids)])
    pixels = ref.pixels_for(rng, grids, policy.config.vision.patch_dim)
    mine = policy.logits(ids, pixel_values=pixels, image_grid_thw=grids)
    assert _max_diff(mine, ref.hf_logits(model, ids, pixels=pixels, grid=grids)) <= TOL


def test_padded_batch_with_images_logits(pair):
    model, policy, _ = pair
    rng = np.random.RandomState(5)
    grids = [(1, 4, 6), (1, 2, 4), (1, 6, 6)]
    rows = [ref.image_sequence(rng, grids[:1], lead=1, tail=2), ref.image_sequence(rng, grids[1:], lead=6)]
    ids, mask = ref.left_pad(rows)
    pixels = ref.pixels_for(rng, grids, policy.config.vision.patch_dim)
    mine = policy.logits(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids)
    theirs = ref.hf_logits(model, ids, mask, pixels, grids)
    assert _max_diff(mine, theirs, mask) <= TOL


def test_padded_text_batch_logits(pair):
    model, policy, _ = pair
    rng = np.random.RandomState(6)
    ids, mask = ref.left_pad([list(rng.randint(0, 240, 5)), list(rng.randint(0, 240, 12))])
    positions, _ = policy.get_rope_index(ids, None, mask)
    # transformers' text-only forward counts padding in its default positions; give it the real ones.
    theirs = ref.hf_logits(model, ids, mask, position_ids=np.asarray(positions))
    assert _max_diff(policy.logits(ids, attention_mask=mask), theirs, mask) <= TOL
