"""Memory/compile knobs change how, not what: scanned decoder layers (stacked params), remat policies and chunked
attention give the logits of the plain model; HF import/export maps the stacked layout both ways."""

import jax
import numpy as np
import pytest

from jaxwebrl.models.hf_io import load_pretrained, save_pretrained
from jaxwebrl.models.stacking import stack, unstack
from jaxwebrl.models.policy import Policy
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.models.vl_model import VisionLanguageModel
from tests.models import hf_reference as ref

TOL = 1e-4


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """transformers' tiny Qwen3-VL (3 layers, DeepStack on two of them) and its checkpoint loaded scanned."""
    out = tmp_path_factory.mktemp("qwen3_vl_scan")
    model = ref.tiny_qwen3_vl(out)
    scanned = load_pretrained(str(out), dtype="float32", model_options=dict(scan_layers=True, remat="full"))
    return model, scanned, str(out)


def _image_batch(config, seed=0):
    rng = np.random.RandomState(seed)
    grids = [(1, 4, 6), (1, 2, 2)]
    ids, mask = ref.left_pad([ref.image_sequence(rng, grids[:1]), ref.image_sequence(rng, grids[1:], lead=2)])
    return ids, mask, ref.pixels_for(rng, grids, config.vision.patch_dim), grids


def test_checkpoint_loads_into_stacked_leaves_with_transformers_logits(hf_pair):
    model, scanned, _ = hf_pair
    layers = scanned.params["language_model"]["layers"]
    assert "layers_0" not in scanned.params["language_model"]
    assert layers["mlp"]["gate_proj"]["kernel"].shape[0] == 3          # [L, in, out]
    # vision runs end at the DeepStack taps (blocks 0 and 1 of 3): blocks_0_to_0, blocks_1_to_1, blocks_2_to_2
    assert {k for k in scanned.params["visual"] if k.startswith("blocks")} == {
        "blocks_0_to_0", "blocks_1_to_1", "blocks_2_to_2"}
    ids, mask, pixels, grids = _image_batch(scanned.config)
    mine = scanned.logits(ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids)
    theirs = ref.hf_logits(model, ids, mask, pixels, grids)
    diff = np.abs(np.asarray(mine) - theirs)[mask.astype(bool)].max()
    assert diff <= TOL, diff


def test_export_of_stacked_params_round_trips(hf_pair, tmp_path):
    model, scanned, _ = hf_pair
    save_pretrained(scanned, str(tmp_path))
    plain = load_pretrained(str(tmp_path), dtype="float32", with_processor=False)
    assert "layers_2" in plain.params["language_model"]
    restacked = stack(plain.params, scanned.config)
    for a, b in zip(jax.tree_util.tree_leaves(scanned.params), jax.tree_util.tree_leaves(restacked)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = np.random.RandomState(3).randint(0, 240, (2, 9))
    assert np.abs(np.asarray(plain.logits(ids)) - ref.hf_logits(model, ids)).max() <= TOL


@pytest.mark.parametrize("remat", ["none", "minimal", "save_qkv_proj"])
def test_knobs_keep_logits_and_gradients(hf_pair, remat):
    """Scanned + a remat policy + chunked attention (3-query chunks) vs the plain unrolled model: same logits and
    gradients (the knobs change memory and compile time only)."""
    _, scanned, _ = hf_pair
    plain_config = scanned.config.replace(scan_layers=False, remat="none", attention_chunk=0)
    knob_config = scanned.config.replace(remat=remat, attention_chunk=3)
    plain_params = unstack(scanned.params, scanned.config)
    ids, mask, pixels, grids = _image_batch(scanned.config, seed=1)
    grid = np.asarray(grids)

    def loss(module):
        def f(params):
            logits, _ = module.apply({"params": params}, ids, attention_mask=mask, pixel_values=pixels,
                                     image_grid_thw=grid)
            return (jax.nn.log_softmax(logits, -1)[..., 5] * mask).sum(), logits
        return jax.jit(jax.value_and_grad(f, has_aux=True))

    (l_plain, logits_plain), g_plain = loss(VisionLanguageModel(plain_config))(plain_params)
    (l_knob, logits_knob), g_knob = loss(VisionLanguageModel(knob_config))(scanned.params)
    valid = mask.astype(bool)
    assert np.abs(np.asarray(logits_plain) - np.asarray(logits_knob))[valid].max() <= 1e-5
    g_knob = unstack(g_knob, scanned.config)
    flat_plain = jax.tree_util.tree_flatten_with_path(g_plain)[0]
    flat_knob = dict(jax.tree_util.tree_flatten_with_path(g_knob)[0])
    for path, value in flat_plain:
        np.testing.assert_allclose(np.asarray(flat_knob[path]), np.asarray(value), rtol=2e-4, atol=2e-6,
                                   err_msg=jax.tree_util.keystr(path))


def test_sampler_decodes_a_scanned_policy_like_the_plain_one(hf_pair):
    _, scanned, _ = hf_pair
    plain = Policy(scanned.config.replace(scan_layers=False), VisionLanguageModel(scanned.config.replace(
        scan_layers=False)), unstack(scanned.params, scanned.config))
    prompts = [{"input_ids": np.array([5, 6, 7, 8], np.int32)}, {"input_ids": np.array([9, 10], np.int32)}]
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0)
    a = Sampler(scanned.module, scanned.config).generate((scanned.params, 0), prompts, sampling, seed=4)
    b = Sampler(plain.module, plain.config).generate((plain.params, 0), prompts, sampling, seed=4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


def test_vision_runs_between_deepstack_taps_scan_like_the_unrolled_tower():
    """4 vision blocks, DeepStack after block 1: runs blocks_0_to_1 and blocks_2_to_3, stacked [2, ...]; same
    image features and logits as the unrolled tower on the unstacked params."""
    import dataclasses

    from jaxwebrl.models.config import tiny_config
    from jaxwebrl.models.policy import init_params

    base = tiny_config()
    base = base.replace(vision=dataclasses.replace(base.vision, depth=4, deepstack_visual_indexes=(1,)))
    scanned_config = base.replace(scan_layers=True, remat="full")
    module, params = init_params(scanned_config, seed=3)
    assert params["visual"]["blocks_2_to_3"]["attn"]["qkv"]["kernel"].shape[0] == 2
    plain = VisionLanguageModel(base)
    rng = np.random.RandomState(5)
    merge = base.vision.spatial_merge_size
    ids = np.concatenate([[[1, 2, base.vision_start_token_id]], [[base.image_token_id] * (16 // merge**2)],
                          [[base.vision_end_token_id, 7, 8]]], axis=1).astype(np.int32)
    pixels = rng.randn(16, base.vision.patch_dim).astype(np.float32)
    grid = np.array([[1, 4, 4]])
    a, _ = module.apply({"params": params}, ids, pixel_values=pixels, image_grid_thw=grid)
    b, _ = plain.apply({"params": unstack(params, scanned_config)}, ids, pixel_values=pixels, image_grid_thw=grid)
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5
    again = stack(unstack(params, scanned_config), scanned_config)
    for x, y in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
