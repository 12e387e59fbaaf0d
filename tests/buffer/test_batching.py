"""Batch assembly from episodes read back out of a real buffer."""

import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.batching import (STEP_SCALARS, bucket_batches, episodes_to_rows, gather_screenshots, pack_rows,
                                      pad_batch)
from tests.buffer.factory import SHAPE, make_episode


@pytest.fixture(scope="module")
def episodes_and_store(tmp_path_factory):
    buf = RingBuffer.create(tmp_path_factory.mktemp("batching") / "buf", capacity_steps=128, max_seq_len=48,
                            screenshot_shape=SHAPE, capacity_screenshots=128, max_images_per_step=2)
    for seed in range(8):
        buf.append(make_episode(seed))
    return buf.read().episodes, buf.screenshots


def test_rows_carry_step_scalars(episodes_and_store):
    episodes, _ = episodes_and_store
    rows = episodes_to_rows(episodes)
    assert len(rows) == sum(len(ep["input_ids"]) for ep in episodes)
    last = rows[len(episodes[0]["input_ids"]) - 1]
    ep = episodes[0]
    assert last["episode_id"] == ep["episode_id"] and last["step_index"] == len(ep["input_ids"]) - 1
    assert last["terminated"] == ep["terminated"][-1] and last["reward"] == ep["reward"][-1]
    np.testing.assert_array_equal(last["versions"], ep["versions"][-1])


def test_pad_batch_layout(episodes_and_store):
    rows = episodes_to_rows(episodes_and_store[0])[:5]
    batch = pad_batch(rows, seq_len=64, batch_size=8, pad_id=3)
    assert batch["input_ids"].shape == (8, 64) and batch["input_ids"].dtype == np.int32
    assert batch["behave_logprobs"].dtype == np.float32 and batch["loss_mask"].dtype == np.int8
    for i, row in enumerate(rows):
        L = len(row["input_ids"])
        np.testing.assert_array_equal(batch["input_ids"][i, :L], row["input_ids"])
        assert (batch["input_ids"][i, L:] == 3).all() and (batch["versions"][i, L:] == -1).all()
        assert (batch["loss_mask"][i, L:] == 0).all() and batch["attention_mask"][i].sum() == L
        np.testing.assert_array_equal(batch["screenshot_refs"][i, :len(row["screenshot_refs"])], row["screenshot_refs"])
    assert batch["row_valid"].tolist() == [True] * 5 + [False] * 3
    assert (batch["loss_mask"][5:] == 0).all()
    with pytest.raises(ValueError, match="seq_len"):
        pad_batch(rows, seq_len=4)


def test_bucketing_covers_every_row_once_with_less_padding(episodes_and_store):
    rows = episodes_to_rows(episodes_and_store[0])
    batches = bucket_batches(rows, batch_size=4, buckets=[16, 32, 48])
    order = np.concatenate([b["row_index"][b["row_valid"]] for b in batches])
    assert sorted(order.tolist()) == list(range(len(rows)))
    for b in batches:
        T = b["input_ids"].shape[1]
        lengths = b["seq_lens"][b["row_valid"]]
        assert (lengths <= T).all() and (lengths > {16: 0, 32: 16, 48: 32}[T]).all()
        for i in np.flatnonzero(b["row_valid"]):
            L, source = b["seq_lens"][i], rows[b["row_index"][i]]
            np.testing.assert_array_equal(b["behave_logprobs"][i, :L], source["behave_logprobs"])
    bucketed_tokens = sum(b["input_ids"].size for b in batches)
    single = pad_batch(rows, batch_size=4 * len(batches))
    assert bucketed_tokens < single["input_ids"].size


def test_packing_round_trips_segments(episodes_and_store):
    rows = episodes_to_rows(episodes_and_store[0])
    packed = pack_rows(rows, seq_len=96)
    assert packed["input_ids"].shape[1] == 96
    total = sum(len(r["input_ids"]) for r in rows)
    assert (packed["segment_ids"] > 0).sum() == total
    assert packed["input_ids"].shape[0] <= -(-total // 96) + 2  # first-fit decreasing is near-tight
    found = 0
    for b in range(packed["input_ids"].shape[0]):
        for m, i in enumerate(packed["segment_row"][b]):
            if i < 0:
                continue
            sel = packed["segment_ids"][b] == m + 1
            row = rows[i]
            for key in ("input_ids", "loss_mask", "behave_logprobs", "versions"):
                np.testing.assert_array_equal(packed[key][b, sel], row[key])
            np.testing.assert_array_equal(packed["positions"][b, sel], np.arange(len(row["input_ids"])))
            for key in STEP_SCALARS:
                assert (packed[key][b, sel] == row[key]).all(), key
            np.testing.assert_array_equal(packed["segment_refs"][b, m, :len(row["screenshot_refs"])],
                                          row["screenshot_refs"])
            found += 1
    assert found == len(rows)
    with pytest.raises(ValueError, match="num_rows"):
        pack_rows(rows, seq_len=96, num_rows=1)


def test_gather_screenshots_by_reference(episodes_and_store):
    episodes, store = episodes_and_store
    batch = pad_batch(episodes_to_rows(episodes)[:6], batch_size=8)
    refs = batch["screenshot_refs"]
    images, index = gather_screenshots(store, refs)
    assert index.shape == refs.shape and (index[refs < 0] == -1).all()
    assert len(images) == len(np.unique(refs[refs >= 0]))
    for pos in zip(*np.nonzero(refs >= 0)):
        np.testing.assert_array_equal(images[index[pos]], store.get(int(refs[pos])))
