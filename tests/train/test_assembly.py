"""Episodes written by a real worker into a real ring buffer become one padded UpdateBatch with their images."""

import numpy as np

from jaxwebrl.buffer import RingBuffer
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig
from jaxwebrl.train.assembly import assemble, row_bucket

IMAGE_TOKEN = 266


def test_row_bucket():
    assert [row_bucket(n, 2) for n in (1, 2, 3, 5, 9, 17)] == [2, 2, 4, 8, 16, 32]


def test_assemble_rows_tokens_and_pixels(tmp_path):
    processor = tiny_processor()
    buf = RingBuffer.create(str(tmp_path / "buf"), capacity_steps=256, max_seq_len=1024, screenshot_shape=(64, 64, 3),
                            max_images_per_step=1)
    backend = ScriptedBackend(toy_oracle_responder(0.5), processor=processor, fetch_image=buf.screenshots.get)
    worker = RolloutWorker(WorkerConfig(tasks=("toy",), group_size=2, prompt={"window": 0}, max_new_tokens=32),
                           InProcessClient(backend), buf)
    worker.run(max_groups=2)
    episodes, _ = buf.read(None, group_size=2)
    batch, rows = assemble(episodes, screenshots=buf.screenshots, image_processor=processor.image_processor,
                           n_minibatches=2, max_seq_len=1024, pad_id=0)
    n = sum(len(e["input_ids"]) for e in episodes)
    assert batch.num_real_rows == len(rows) == n
    B, T = batch.input_ids.shape
    assert B == row_bucket(n, 2) and T in (64, 128, 256, 512, 1024) and T >= max(len(r["input_ids"]) for r in rows)
    for i, row in enumerate(rows):
        L = len(row["input_ids"])
        np.testing.assert_array_equal(batch.input_ids[i, :L], row["input_ids"])
        np.testing.assert_array_equal(batch.loss_mask[i, :L], row["loss_mask"])
        assert batch.attention_mask[i, :L].all() and not batch.attention_mask[i, L:].any()
    assert not batch.loss_mask[n:].any() and (batch.attention_mask[n:, 0] == 1).all()
    # one screenshot per row (window 0); pixels and grids follow the rows, and the prompt's image tokens match
    assert batch.images_per_row.tolist() == [1] * n + [0] * (B - n)
    merged = np.prod(batch.image_grid_thw, axis=-1) // 4
    assert [(batch.input_ids[i] == IMAGE_TOKEN).sum() for i in range(n)] == merged.tolist()
    assert batch.pixel_values.shape[0] == np.prod(batch.image_grid_thw, axis=-1).sum()
    first = buf.screenshots.get(int(rows[0]["screenshot_refs"][0]))
    expected, _ = processor.image_processor([first])
    np.testing.assert_allclose(batch.pixel_values[:len(expected)], expected)
