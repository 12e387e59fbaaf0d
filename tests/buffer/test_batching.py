"""Batch assembly from episodes read back out of a real buffer: arrays built once from Episode.steps."""

import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.batching import STEP_SCALARS, gather_screenshots, pack_steps, pad_steps
from tests.buffer.factory import SHAPE, make_episode


@pytest.fixture(scope="module")
def episodes_and_store(tmp_path_factory):
    buf = RingBuffer.create(tmp_path_factory.mktemp("batching") / "buf", capacity_steps=128, max_seq_len=48,
                            screenshot_shape=SHAPE, capacity_screenshots=128, max_images_per_step=2)
    for seed in range(8):
        buf.append(make_episode(seed))
    return buf.read().episodes, buf.screenshots


def _steps(episodes):
    return [(ep, j, step) for ep in episodes for j, step in enumerate(ep.steps)]


def test_rows_carry_step_scalars(episodes_and_store):
    episodes, _ = episodes_and_store
    batch = pad_steps(episodes)
    assert len(batch["input_ids"]) == sum(ep.num_steps for ep in episodes)
    ep = episodes[0]
    last = ep.num_steps - 1
    assert batch["episode_id"][last] == ep.episode_id and batch["step_index"][last] == last
    assert batch["terminated"][last] == ep.terminated and batch["reward"][last] == np.float32(ep.reward)
    assert not batch["terminated"][:last].any() and not batch["truncated"][:last].any()
    np.testing.assert_array_equal(batch["versions"][last, :ep.steps[-1].num_tokens], ep.steps[-1].versions)


def test_pad_steps_layout(episodes_and_store):
    episodes = episodes_and_store[0][:2]
    steps = _steps(episodes)
    batch = pad_steps(episodes, seq_len=64, batch_size=8, pad_id=3)
    assert batch["input_ids"].shape == (8, 64) and batch["input_ids"].dtype == np.int32
    assert batch["behave_logprobs"].dtype == np.float32 and batch["loss_mask"].dtype == np.int8
    for i, (_, _, step) in enumerate(steps):
        L = step.num_tokens
        np.testing.assert_array_equal(batch["input_ids"][i, :L], step.input_ids)
        assert (batch["input_ids"][i, L:] == 3).all() and (batch["versions"][i, L:] == -1).all()
        assert (batch["loss_mask"][i, L:] == 0).all() and batch["attention_mask"][i].sum() == L
        np.testing.assert_array_equal(batch["screenshot_refs"][i, :len(step.screenshot_refs)], step.screenshot_refs)
    n = len(steps)
    assert batch["row_valid"].tolist() == [True] * n + [False] * (8 - n)
    assert (batch["loss_mask"][n:] == 0).all()
    with pytest.raises(ValueError, match="seq_len"):
        pad_steps(episodes, seq_len=4)


def test_episodes_not_read_from_the_buffer_are_refused():
    with pytest.raises(ValueError, match="no episode_id"):
        pad_steps([make_episode(1)])


def test_packing_round_trips_segments(episodes_and_store):
    episodes = episodes_and_store[0]
    steps = _steps(episodes)
    packed = pack_steps(episodes, seq_len=96)
    assert packed["input_ids"].shape[1] == 96
    total = sum(step.num_tokens for _, _, step in steps)
    assert (packed["segment_ids"] > 0).sum() == total
    assert packed["input_ids"].shape[0] <= -(-total // 96) + 2  # first-fit decreasing is near-tight
    single = pad_steps(episodes)
    found = 0
    for b in range(packed["input_ids"].shape[0]):
        for m, i in enumerate(packed["segment_row"][b]):
            if i < 0:
                continue
            sel = packed["segment_ids"][b] == m + 1
            step = steps[i][2]
            for key in ("input_ids", "loss_mask", "behave_logprobs", "versions"):
                np.testing.assert_array_equal(packed[key][b, sel], getattr(step, key))
            np.testing.assert_array_equal(packed["positions"][b, sel], np.arange(step.num_tokens))
            for key in STEP_SCALARS:
                assert (packed[key][b, sel] == single[key][i]).all(), key
            np.testing.assert_array_equal(packed["segment_refs"][b, m, :len(step.screenshot_refs)],
                                          step.screenshot_refs)
            found += 1
    assert found == len(steps)
    with pytest.raises(ValueError, match="num_rows"):
        pack_steps(episodes, seq_len=96, num_rows=1)


def test_gather_screenshots_by_reference(episodes_and_store):
    episodes, store = episodes_and_store
    batch = pad_steps(episodes[:3], batch_size=16)
    refs = batch["screenshot_refs"]
    images, index = gather_screenshots(store, refs)
    assert index.shape == refs.shape and (index[refs < 0] == -1).all()
    assert len(images) == len(np.unique(refs[refs >= 0]))
    for pos in zip(*np.nonzero(refs >= 0)):
        np.testing.assert_array_equal(images[index[pos]], store.get(int(refs[pos])))
