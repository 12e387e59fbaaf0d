"""Prefill + step-by-step cached decode equals the full no-cache forward (left padding, images)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.kv_cache import init_cache
from jaxwebrl.models.policy import tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=3)


def _image_prompt(config, rng, batch, length, image_at, grid_hw):
    """input_ids [B, T] with one image (grid 1 x h x w patches) starting at `image_at` in every row."""
    merge = config.vision.spatial_merge_size
    n_image = grid_hw[0] * grid_hw[1] // merge**2
    ids = rng.randint(0, 256, (batch, length))
    ids[:, image_at - 1] = config.vision_start_token_id
    ids[:, image_at : image_at + n_image] = config.image_token_id
    ids[:, image_at + n_image] = config.vision_end_token_id
    return ids


@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("fresh",))
def _apply(module, grid_key, params, ids, mask, pixel_values, cache, fresh=False):
    grid = None if grid_key is None else np.asarray(grid_key)
    return module.apply(
        {"params": params}, ids, attention_mask=mask, pixel_values=pixel_values, image_grid_thw=grid, cache=cache,
        fresh_cache=fresh,
    )


def _decode_stepwise(policy, ids, mask, prefill_len, pixel_values=None, grid=None):
    """Prefill ids[:, :prefill_len] into a fresh cache, then feed the rest one token at a time."""
    module, params = policy.module, policy.params
    b, t = ids.shape
    cache = init_cache(policy.config, b, t + 3)
    grid_key = None if grid is None else tuple(map(tuple, np.asarray(grid).tolist()))
    logits, cache = _apply(module, grid_key, params, ids[:, :prefill_len], mask[:, :prefill_len], pixel_values, cache)
    outs = [logits]
    for i in range(prefill_len, t):
        logit, cache = _apply(module, None, params, ids[:, i : i + 1], mask[:, i : i + 1], None, cache)
        outs.append(logit)
    return np.asarray(jnp.concatenate(outs, axis=1)), cache


def test_cached_decode_equals_full_forward_with_left_and_right_padding(policy):
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 256, (2, 20))
    mask = np.ones((2, 20), np.int32)
    mask[0, :4] = 0  # left-padded prompt
    mask[1, 12:15] = 0  # right-padded prompt: decoding continues after the padding slots
    full = np.asarray(policy.logits(ids, attention_mask=mask))
    stepped, cache = _decode_stepwise(policy, ids, mask, prefill_len=15)
    real = mask.astype(bool)
    assert np.abs(stepped - full)[real].max() <= 1e-5
    np.testing.assert_array_equal(np.asarray(cache["index"]), [20, 20])
    np.testing.assert_array_equal(np.asarray(cache["valid"])[:, :20], real)
    np.testing.assert_array_equal(np.asarray(cache["next_position"]), real.sum(1))


def test_padded_row_matches_unpadded_row(policy):
    rng = np.random.RandomState(1)
    ids = rng.randint(0, 256, (1, 10))
    padded = np.concatenate([np.zeros((1, 3), ids.dtype), ids], axis=1)
    mask = np.concatenate([np.zeros((1, 3)), np.ones((1, 10))], axis=1).astype(np.int32)
    alone = np.asarray(policy.logits(ids))
    together = np.asarray(policy.logits(padded, attention_mask=mask))[:, 3:]
    assert np.abs(alone - together).max() <= 1e-5


def test_cached_decode_after_an_image_continues_mrope_positions(policy):
    c = policy.config
    rng = np.random.RandomState(2)
    ids = _image_prompt(c, rng, batch=2, length=20, image_at=3, grid_hw=(4, 6))
    mask = np.ones_like(ids)
    mask[1, :2] = 0  # pads before the vision-start token of row 1
    ids[1, :2] = 0
    pixels = np.concatenate([rng.randn(24, c.vision.patch_dim)] * 2).astype(np.float32)
    grid2 = np.array([[1, 4, 6], [1, 4, 6]])
    full = np.asarray(policy.logits(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid2))
    stepped, cache = _decode_stepwise(policy, ids, mask, 15, pixels, grid2)
    assert np.abs(stepped - full)[mask.astype(bool)].max() <= 1e-5
    positions, deltas = policy.get_rope_index(ids, grid2, mask)
    np.testing.assert_array_equal(np.asarray(cache["next_position"]), np.asarray(positions).max(axis=(0, 2)) + 1)
    assert (np.asarray(deltas) < 0).all()  # 6 image tokens occupy only max(2, 3) = 3 positions


@pytest.mark.parametrize("chunk", [0, 8])
def test_a_fresh_prefill_over_its_own_keys_equals_the_prefill_over_the_whole_cache(policy, chunk):
    """The sampler's prefill (`fresh_cache`: the prompt attends its own keys causally, on the model's kernel) gives
    the logits and the cache of the prefill that attends every slot, for left-padded prompts with an image."""
    config = policy.config.replace(attention_chunk=chunk)
    module = type(policy.module)(config)
    rng = np.random.RandomState(2)
    grid = np.array([[1, 4, 4]])
    ids = np.concatenate([_image_prompt(config, rng, 1, 20, 5, (4, 4))] * 3)
    mask = np.ones((3, 20), np.int32)
    mask[1, :6] = 0                              # left-padded prompts; row 2 all filler
    mask[2, :] = 0
    ids[2, :] = 0
    ids[1, :6] = 0
    ids[1, 6:] = _image_prompt(config, rng, 1, 14, 2, (4, 4))[0]
    grid = np.array([[1, 4, 4]] * 2)
    pixels = jnp.asarray(rng.randn(32, config.vision.patch_dim), jnp.float32)
    grid_key = tuple(map(tuple, grid.tolist()))
    outs = [_apply(module, grid_key, policy.params, ids, mask, pixels, init_cache(config, 3, 24), fresh=f)
            for f in (False, True)]
    (whole, whole_cache), (own, own_cache) = outs
    real = mask.astype(bool)
    assert np.abs(np.asarray(whole) - np.asarray(own))[real].max() <= 1e-5
    for name in ("index", "valid", "next_position"):
        np.testing.assert_array_equal(np.asarray(whole_cache[name]), np.asarray(own_cache[name]))
    valid = np.asarray(own_cache["valid"])[:, None, :, None]          # padding slots are never read
    for a, b in zip(jax.tree.leaves(whole_cache["layers"]), jax.tree.leaves(own_cache["layers"])):
        np.testing.assert_allclose(np.asarray(a) * valid, np.asarray(b) * valid, atol=1e-5)
