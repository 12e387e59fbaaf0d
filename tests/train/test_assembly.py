"""Episodes written by a real worker into a real ring buffer become one padded UpdateBatch with their images."""

import itertools

import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig
from jaxwebrl.buffer.batching import pad_steps
from jaxwebrl.buffer.episode import Episode, Step
from jaxwebrl.train.assembly import (LENGTH_MULTIPLE, assemble, balanced_minibatches, length_bucket, row_bucket,
                                     rows_bucket)

IMAGE_TOKEN = 266


def test_row_buckets_step_by_at_most_a_quarter():
    assert [rows_bucket(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 11, 17, 33, 65, 81, 129, 1000)] == \
        [1, 2, 3, 4, 5, 7, 8, 10, 12, 20, 40, 80, 96, 160, 1024]
    for n in range(1, 5000):
        bucket = rows_bucket(n)
        assert n <= bucket and (bucket - n) < 0.2 * bucket + 1      # padding rows under a fifth of the shape
    assert len({rows_bucket(n) for n in range(257, 513)}) == 4       # four shapes per octave
    assert [row_bucket(n, 2) for n in (1, 2, 3, 5, 9, 17, 129)] == [2, 2, 4, 6, 10, 20, 160]


def _makespans(tokens, n_minibatches):
    split = balanced_minibatches(tokens, n_minibatches)
    return split, np.array([tokens[rows].sum() for rows in split])


def test_length_buckets_step_by_at_most_a_quarter_and_stop_at_the_buffer_width():
    # the tiny default's rows (234-378 tokens) pad to 384, not the power of two 512
    assert length_bucket(378, 512) == 384 and length_bucket(234, 512) == 256 and length_bucket(257, 512) == 320
    lengths = np.arange(1, 4097)
    sizes = np.array([length_bucket(n, 4096) for n in lengths])
    assert (sizes >= lengths).all() and (sizes % LENGTH_MULTIPLE == 0).all()
    assert (sizes[lengths > 8 * LENGTH_MULTIPLE] < 1.25 * lengths[lengths > 8 * LENGTH_MULTIPLE]).all()
    assert len(set(sizes[(lengths > 1024) & (lengths <= 2048)].tolist())) == 4   # 4 programs an octave
    assert length_bucket(500, 500) == 500                                        # capped at max_seq_len


def test_a_row_longer_than_the_buffer_width_is_refused_by_name():
    mask = np.r_[np.zeros(500), 1].astype(np.int8)
    step = Step(input_ids=np.ones(501, np.int32), loss_mask=mask, behave_logprobs=-mask.astype(np.float32),
                versions=np.where(mask > 0, 0, -1))
    long = Episode(steps=(step,), task_id="toy", group_id=0, reward=0.0, episode_id=0)
    with pytest.raises(ValueError, match="does not fit seq_len=500"):
        pad_steps([long], seq_len=length_bucket(501, 500))


def test_balanced_minibatches_fix_the_issue_cases():
    """17 rows in 4 minibatches were [8, 8, 1, 0] real rows and 129 in 2 were [128, 1] (contiguous chunks, padding
    last); balanced by policy tokens, no minibatch is empty and every one has the bucket's row count."""
    rng = np.random.default_rng(0)
    for n, k in ((17, 4), (129, 2), (5, 4)):
        rows = row_bucket(n, k)
        tokens = np.zeros(rows, np.int64)
        tokens[:n] = rng.integers(1, 60, size=n)
        split, loads = _makespans(tokens, k)
        assert split.shape == (k, rows // k)
        np.testing.assert_array_equal(np.sort(split.ravel()), np.arange(rows))
        assert (loads > 0).all() and loads.max() - loads.min() <= tokens.max()
        real = [(r < n).sum() for r in split]
        assert min(real) >= 1, real
    split, loads = _makespans(np.array([10, 0, 0, 0]), 2)              # one row with tokens: one minibatch has it
    assert sorted(loads) == [0, 10]


@pytest.mark.parametrize("seed", range(20))
def test_balanced_minibatches_are_within_the_greedy_bound_of_the_optimum(seed):
    """Longest-first greedy (LPT, as AReaL's FFD allocation sorts before placing): the heaviest minibatch is within
    4/3 - 1/(3k) of the best split with equal row counts, found here by brute force."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 4))
    per = int(rng.integers(1, 4))
    tokens = rng.integers(0, 100, size=k * per)
    _, loads = _makespans(tokens, k)
    best = min(max(tokens[list(p[i * per:(i + 1) * per])].sum() for i in range(k))
               for p in itertools.permutations(range(k * per)))
    assert loads.max() <= (4 / 3 - 1 / (3 * k)) * best + 1e-9 or loads.max() == best


def test_balanced_minibatches_refuse_rows_that_do_not_split_evenly():
    with pytest.raises(ValueError, match="equal size"):
        balanced_minibatches(np.ones(5), 2)


def test_assemble_rows_tokens_and_pixels(tmp_path):
    processor = tiny_processor()
    buf = RingBuffer.create(str(tmp_path / "buf"), capacity_steps=256, max_seq_len=1024, screenshot_shape=(64, 64, 3),
                            max_images_per_step=1)
    backend = ScriptedBackend(toy_oracle_responder(0.5), processor=processor, fetch_image=buf.screenshots.get)
    worker = RolloutWorker(WorkerConfig(tasks=("toy",), group_size=2, prompt={"window": 0}, max_new_tokens=32),
                           InProcessClient(backend), buf)
    worker.run(max_groups=2)
    episodes, _ = buf.read(None, group_size=2)
    batch = assemble(episodes, screenshots=buf.screenshots, image_processor=processor.image_processor,
                     n_minibatches=2, max_seq_len=1024, pad_id=0)
    steps = [step for e in episodes for step in e.steps]     # the rows: episodes in order, their steps in order
    n = sum(e.num_steps for e in episodes)
    assert batch.num_real_rows == len(steps) == n
    B, T = batch.input_ids.shape
    longest = max(step.num_tokens for step in steps)
    assert B == row_bucket(n, 2) and T == length_bucket(longest, 1024) and longest <= T < 1.25 * longest + 16
    np.testing.assert_array_equal(batch.rewards, [e.reward for e in episodes for _ in e.steps])
    for i, step in enumerate(steps):
        L = step.num_tokens
        np.testing.assert_array_equal(batch.input_ids[i, :L], step.input_ids)
        np.testing.assert_array_equal(batch.loss_mask[i, :L], step.loss_mask)
        assert batch.attention_mask[i, :L].all() and not batch.attention_mask[i, L:].any()
    assert not batch.loss_mask[n:].any() and (batch.attention_mask[n:, 0] == 1).all()
    # one screenshot per row (window 0): rows point at the distinct screenshot records once each (rows showing the
    # same record share it), padding at none, and the prompt's image tokens match that image's merged patches
    refs = np.array([step.screenshot_refs[0] for step in steps])
    assert batch.image_index.shape == (B, 1) and (batch.image_index[n:] == -1).all()
    _, expected_index = np.unique(refs, return_inverse=True)
    np.testing.assert_array_equal(batch.image_index[:n, 0], expected_index)
    merged = np.prod(batch.image_grid_thw, axis=-1) // 4
    assert [(batch.input_ids[i] == IMAGE_TOKEN).sum() for i in range(n)] == merged[batch.image_index[:n, 0]].tolist()
    assert batch.pixel_values.shape[0] == np.prod(batch.image_grid_thw, axis=-1).sum()
    first = buf.screenshots.get(int(steps[0].screenshot_refs[0]))
    expected, _ = processor.image_processor([first])
    start = int(np.prod(batch.image_grid_thw[:batch.image_index[0, 0]], axis=-1).sum())
    np.testing.assert_allclose(batch.pixel_values[start:start + len(expected)], expected)
