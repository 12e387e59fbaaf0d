"""The update's minibatch layout: each distinct screenshot encoded once per minibatch and its features gathered into
every row that shows it; rows run in length groups, each at its own width.

Real toy episodes played with a prompt window of 2 (a step's prompt shows its own and the two previous screenshots,
so consecutive rows share them), on the tiny Qwen3-VL policy.
"""

import jax
import numpy as np
import pytest

from configs.constT10 import get_config
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.train import rl_config
from jaxwebrl.train.assembly import UpdateBatch, assemble
from jaxwebrl.train.length_layouts import LengthLayouts, length_groups
from jaxwebrl.train.update import OptimizerConfig, Updater
from tests.train.conftest import play_toy


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def shared_batch(policy, tmp_path_factory):
    """(UpdateBatch of 2 groups of 4 toy episodes played with prompt_window=2, its screenshot refs [B, K])."""
    buffer = RingBuffer.create(str(tmp_path_factory.mktemp("buffer")), capacity_steps=2048, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=3)
    play_toy(buffer, groups=2, group_size=4, epsilon=0.6, seed=3, window=2)
    episodes, _ = buffer.read(None, group_size=4)
    batch = assemble(episodes, screenshots=buffer.screenshots, image_processor=policy.processor.image_processor,
                     n_minibatches=2, max_seq_len=512)
    return batch


def every_occurrence(batch: UpdateBatch) -> UpdateBatch:
    """The same rows with every image occurrence a copy of its own (the layout that encodes each again)."""
    patches = np.prod(batch.image_grid_thw, axis=-1)
    first = np.cumsum(patches) - patches
    shown = batch.image_index[batch.image_index >= 0]                       # row-major occurrences
    index = np.full(batch.image_index.shape, -1, np.int32)
    index[batch.image_index >= 0] = np.arange(shown.size)
    pixels = np.concatenate([batch.pixel_values[first[u]:first[u] + patches[u]] for u in shown])
    return batch._replace(pixel_values=pixels, image_grid_thw=batch.image_grid_thw[shown], image_index=index)


def test_vision_tower_encodes_each_distinct_screenshot_of_a_minibatch_once(policy, shared_batch):
    """Counted from the shapes the jitted functions get: the minibatch's images are its rows' distinct screenshots
    (fewer than their occurrences: the rows share them), and every row's index points at its own pixels."""
    updater = Updater(policy.module, rl_config.update_settings(get_config("toy")),
                      OptimizerConfig(lr=1e-3, total_steps=1))
    batch = shared_batch
    occurrences = distinct = 0
    for m in updater._split(batch):
        refs = batch.image_index[m.rows]
        n_distinct = np.unique(refs[refs >= 0]).size
        assert n_distinct <= 8                             # below 8 images the bucket is the count itself
        patches_each = int(np.prod(batch.image_grid_thw[0]))
        assert len(m.grid) == n_distinct == m.minibatch.pixel_values.shape[0] // patches_each
        assert m.minibatch.image_index.shape == refs.shape
        occurrences, distinct = occurrences + int((refs >= 0).sum()), distinct + n_distinct
    assert occurrences > 1.5 * distinct, (occurrences, distinct)


def _updater(policy, length_groups: int) -> Updater:
    """The toy recipe's update (2 minibatches, 1 epoch) whose first AdamW step is linear in the gradient: eps (1e-4)
    dwarfs these gradients (global norm ~2e-5), so the step is lr · g / (|g| + eps) ≈ g · 1e4."""
    config = get_config("toy")
    config.train.ppo_n_minibatches, config.train.ppo_n_epochs = 2, 1
    config.train.length_groups = length_groups
    return Updater(policy.module, rl_config.update_settings(config),
                   OptimizerConfig(lr=1.0, eps=1e-4, total_steps=1, max_grad_norm=None))


@pytest.mark.slow   # three update layouts compile: ~1.5 min alone, 7 min on the shared 2-core box
def test_deduplicated_and_length_grouped_update_equals_the_plain_one(policy, shared_batch):
    """Proximal log-probs, loss, gradient norm and the new weights (the gradients, `_updater`) agree to fp32
    rounding between: the deduplicated batch in 8 length groups; the same rows with every image occurrence encoded
    again; and the deduplicated batch with every row of a minibatch at one width."""
    copies = every_occurrence(shared_batch)
    assert copies.image_grid_thw.shape[0] > 1.5 * shared_batch.image_grid_thw.shape[0]
    grouped, plain = _updater(policy, 8), _updater(policy, 1)
    assert any(len(m.groups) > 1 for m in grouped._split(shared_batch))
    runs = [(grouped, shared_batch), (grouped, copies), (plain, shared_batch)]
    np.testing.assert_allclose(grouped.proximal_logprobs(policy.params, shared_batch),
                               plain.proximal_logprobs(policy.params, copies), atol=2e-5)
    outs = []
    for updater, batch in runs:
        params = jax.tree.map(lambda x: x.copy(), policy.params)
        outs.append(updater(params, updater.optimizer.init(params), batch))
    (reference_params, _, reference), *others = outs
    assert reference["grad_norm"] > 1e-6 and reference["optimizer_updates"] == 2
    for other_params, _, other in others:
        for key in ("actor_loss", "grad_norm"):
            np.testing.assert_allclose(other[key], reference[key], rtol=1e-5, atol=1e-7)
        for a, b in zip(jax.tree.leaves(other_params), jax.tree.leaves(reference_params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(p)).max())
                for a, p in zip(jax.tree.leaves(reference_params), jax.tree.leaves(policy.params)))
    assert moved > 1e-2


def test_length_groups_sort_chunk_and_pad_each_chunk_to_its_longest_row():
    """8 rows in 4 chunks of 2, longest first, each padded to the bucket of its longest row; neighbours of one
    width merge; one group asked for: every row at the bucket of the longest."""
    lengths = np.array([300, 20, 250, 1, 100, 290, 17, 60])
    order, groups = length_groups(lengths, 4, 320)
    np.testing.assert_array_equal(order, [0, 5, 2, 4, 7, 1, 6, 3])
    assert groups == ((2, 320), (2, 256), (2, 64), (2, 32))
    _, groups = length_groups(np.array([300, 290, 280, 270, 5, 3]), 3, 320)
    assert groups == ((4, 320), (2, 16))
    assert length_groups(lengths, 1, 320)[1] == ((8, 320),)


def test_kept_layouts_bound_the_compiles_of_varied_rows_and_every_row_fits():
    """The paper recipe's row lengths (about 1,299, 2,342 and 3,385 tokens) in equal shares, T 4,096, 8 rows a
    minibatch in 8 groups, over 200 minibatches: each minibatch's own widths make dozens of layouts (each a compile of
    the update); kept to 4, at most 5 layouts run (4 kept + full width), every row fits its group, and the padding
    stays near the own layouts'."""
    rng = np.random.default_rng(0)
    own, bounded = set(), set()
    layouts = LengthLayouts(n_groups=8, max_layouts=4)
    padded = {"own": 0, "kept": 0}
    for _ in range(200):
        lengths = rng.choice([1299, 2342, 3385], 8) + rng.integers(-40, 41, 8)
        order, groups = layouts(lengths, 4096)
        _, mine = length_groups(lengths, 8, 4096)
        own.add(mine)
        bounded.add(groups)
        start = 0
        for rows, width in groups:
            assert (lengths[order[start:start + rows]] <= width).all() and width <= 4096
            start += rows
        assert start == 8 and sorted(order) == list(range(8))
        padded["own"] += sum(r * w for r, w in mine)
        padded["kept"] += sum(r * w for r, w in groups)
    assert len(own) > 20 and len(bounded) <= 5, (len(own), len(bounded))
    assert padded["own"] <= padded["kept"] <= 1.25 * padded["own"], padded


def test_a_kept_layout_serves_a_narrower_minibatch_within_the_slack_else_the_own_is_kept_until_full():
    layouts = LengthLayouts(n_groups=2, max_layouts=2)
    assert layouts.widths((512, 256), 4, 1024) == (512, 256)           # kept
    assert layouts.widths((512, 240), 4, 1024) == (512, 256)           # (512, 256) covers it, within the slack
    assert layouts.widths((384, 128), 4, 1024) == (384, 128)           # covered at +60% tokens: its own is kept
    assert layouts.widths((320, 128), 4, 1024) == (384, 128)           # full: the narrowest kept cover
    assert layouts.widths((640, 128), 4, 1024) == (1024, 1024)         # full, none covers: every row at T
    assert layouts.widths((512, 256), 2, 512) == (512, 256)            # another minibatch shape keeps its own
    with pytest.raises(ValueError, match="train.length_layouts >= 1"):
        LengthLayouts(n_groups=2, max_layouts=0)
    config = get_config("toy")
    config.train.length_groups, config.train.length_layouts = 3, 2        # the config reaches the Updater's layouts
    settings = rl_config.update_settings(config)
    layouts = Updater(tiny_policy(seed=0).module, settings, OptimizerConfig(lr=1.0, total_steps=1))._layouts
    assert (layouts.n_groups, layouts.max_layouts) == (3, 2)


def test_length_groups_keep_every_token_and_its_logprob(policy, shared_batch):
    """Every row's tokens fit its group's width, the groups hold fewer row-tokens than the minibatch's [R, T], and
    the grouped log-probs equal the full-width forward's on every position."""
    updater = _updater(policy, 8)
    lengths = shared_batch.attention_mask.sum(axis=1)
    trimmed = False
    for m in updater._split(shared_batch):
        R, T = m.minibatch.input_ids.shape
        assert sum(rows for rows, _ in m.groups) == R
        start = 0
        for rows, width in m.groups:
            assert (lengths[m.rows[start:start + rows]] <= width).all() and width <= T
            start += rows
        trimmed |= sum(rows * width for rows, width in m.groups) < R * T
        full = updater._logprobs(policy.params, m.minibatch, m.grid)               # groups=None: one, at T
        grouped = updater._logprobs(policy.params, m.minibatch, m.grid, m.groups)
        np.testing.assert_allclose(np.asarray(grouped), np.asarray(full), atol=2e-5)
    assert trimmed


def test_model_gathers_distinct_images_like_the_batch_order_layout(policy, shared_batch):
    """The module call with image_index (distinct images, gathered) gives the logits of the plain call that binds
    every occurrence's own copy to the image runs in batch order (the sampler's layout), jitted or not."""
    rows = np.flatnonzero((shared_batch.image_index >= 0).sum(axis=1) == 3)[:2]   # rows showing 3 screenshots
    rows = np.r_[rows, np.flatnonzero((shared_batch.image_index >= 0).sum(axis=1) == 1)[:1]]
    batch = shared_batch._replace(input_ids=shared_batch.input_ids[rows],
                                  attention_mask=shared_batch.attention_mask[rows],
                                  image_index=shared_batch.image_index[rows])
    copies = every_occurrence(batch)
    apply = policy.module.apply
    plain, _ = jax.jit(lambda p: apply({"params": p}, batch.input_ids, attention_mask=batch.attention_mask,
                                       pixel_values=copies.pixel_values, image_grid_thw=copies.image_grid_thw))(
        policy.params)

    @jax.jit
    def gathered(index):
        return apply({"params": policy.params}, batch.input_ids, attention_mask=batch.attention_mask,
                     pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw, image_index=index)[0]

    np.testing.assert_allclose(np.asarray(gathered(batch.image_index)), np.asarray(plain), atol=1e-5)
    shuffled = np.where(batch.image_index >= 0, (batch.image_index + 1) % len(batch.image_grid_thw), -1)
    assert np.abs(np.asarray(gathered(shuffled)) - np.asarray(plain)).max() > 1e-3   # the index is what binds
