"""The tiny preset: token ids agree with the tiny tokenizer, gradients flow everywhere, remat and bf16 switches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.policy import init_params, tiny_policy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


def _batch(config, rng, batch=2, length=40):
    """Token rows with one 4 x 4-patch image each (4 image tokens) and left padding in row 0."""
    ids = rng.randint(0, 256, (batch, length))
    ids[:, 5] = config.vision_start_token_id
    ids[:, 6:10] = config.image_token_id
    ids[:, 10] = config.vision_end_token_id
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    grid = ((1, 4, 4),) * batch
    pixels = rng.randn(16 * batch, config.vision.patch_dim).astype(np.float32)
    return ids, mask, pixels, grid


def _loss_fn(module, grid):
    def loss(params, ids, mask, pixels):
        logits, _ = module.apply({"params": params}, ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.asarray(grid))
        logp = jax.nn.log_softmax(logits[:, :-1])
        picked = jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
        weight = mask[:, 1:]
        return -(picked * weight).sum() / weight.sum()

    return loss


def test_tiny_vision_token_ids_match_the_tiny_tokenizer(policy):
    from jaxwebrl.models.tokenizer import VisionTokenIds, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    ids = VisionTokenIds.of(tokenizer)
    c = policy.config
    assert (c.image_token_id, c.video_token_id) == (ids.image_pad, ids.video_pad)
    assert (c.vision_start_token_id, c.vision_end_token_id) == (ids.vision_start, ids.vision_end)
    assert c.text.vocab_size >= tokenizer.vocab_size


def test_gradients_reach_every_parameter_and_remat_matches(policy):
    c = policy.config
    ids, mask, pixels, grid = _batch(c, np.random.RandomState(0))
    loss, grads = jax.jit(jax.value_and_grad(_loss_fn(policy.module, grid)))(policy.params, ids, mask, pixels)
    assert np.isfinite(float(loss)) and abs(float(loss) - np.log(c.text.vocab_size)) < 1.0
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.isfinite(np.asarray(g)).all(), path
        assert np.abs(np.asarray(g)).max() > 0, f"no gradient reaches {jax.tree_util.keystr(path)}"
    remat_module, _ = init_params(tiny_config(remat=True), seed=0)
    loss_r, grads_r = jax.jit(jax.value_and_grad(_loss_fn(remat_module, grid)))(policy.params, ids, mask, pixels)
    assert abs(float(loss_r) - float(loss)) <= 1e-6
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_r)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_bf16_compute_keeps_fp32_logits_close(policy):
    c = policy.config
    ids, mask, pixels, grid = _batch(c, np.random.RandomState(1))
    module_bf16, _ = init_params(c.replace(dtype="bfloat16"), seed=0)
    logits, _ = jax.jit(
        lambda p: module_bf16.apply({"params": p}, ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=np.asarray(grid))
    )(policy.params)
    assert logits.dtype == jnp.float32
    reference = np.asarray(policy.logits(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid))
    diff = np.abs(np.asarray(logits) - reference)[mask.astype(bool)]
    assert 0 < diff.max() < 0.1


def test_bad_inputs_fail_with_clear_errors(policy):
    c = policy.config
    ids, mask, pixels, grid = _batch(c, np.random.RandomState(2))
    with pytest.raises(ValueError, match="image tokens"):
        policy.logits(ids[:, :8], pixel_values=pixels, image_grid_thw=grid)
    with pytest.raises(ValueError, match="pixel_values has shape"):
        policy.logits(ids, pixel_values=pixels[:-1], image_grid_thw=grid)
    with pytest.raises(ValueError, match="together"):
        policy.logits(ids, pixel_values=pixels)
