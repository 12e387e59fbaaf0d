"""The trainer's buffer reads (train/buffer_reads.py): losses counted by kind, surplus members included; a store that
fails for now (an outage on gs://) is read again at the next poll, from the same cursor, until the outage limit."""

import logging

import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.train.buffer_reads import BufferReads, BufferUnreadable
from tests.buffer.factory import SHAPE, make_episode


def _buffer(tmp_path):
    return RingBuffer.create(str(tmp_path / "buf"), capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE,
                             capacity_screenshots=64, max_images_per_step=2)


class Flaky:
    """The buffer, with its next `failures` reads failing as TensorStore fails on gs:// during an outage."""

    def __init__(self, buffer, failures, message='UNAVAILABLE: Error reading "gs://b/run/buffer/log/5": reset'):
        self.buffer, self.failures, self.message, self.cursors = buffer, failures, message, []

    def read(self, cursor, **kw):
        self.cursors.append(cursor)
        if self.failures:
            self.failures -= 1
            raise ValueError(self.message)
        return self.buffer.read(cursor, **kw)


def test_an_outage_is_read_through_from_the_same_cursor_and_losses_are_counted(tmp_path, caplog):
    buffer = _buffer(tmp_path)
    for seed in (0, 1, 2):   # one group of G = 2, and a member beyond it
        buffer.append(make_episode(seed, group_id=5, num_steps=1))
    now = [0.0]
    flaky = Flaky(buffer, failures=2)
    reads = BufferReads(flaky, group_size=2, outage_limit_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="jaxwebrl.train.buffer_reads"):
        assert reads.read(None) is None
        now[0] = 30.0
        assert reads.read(None) is None   # within the limit: waited out
        result = reads.read(None)
    assert flaky.cursors == [None] * 3 and [e.info["seed"] for e in result.episodes] == [0, 1]
    assert reads.losses["surplus"] == 1 and sum(reads.losses.values()) == 1
    text = caplog.text
    assert text.count("read failed for now") == 1 and "readable again after 30 s" in text
    assert "1 episodes beyond their group's env.group_size" in text
    flaky.failures = 3
    assert reads.read(result.cursor) is None
    now[0] = 100.0
    with pytest.raises(BufferUnreadable, match="could not be read for 70 s .*UNAVAILABLE.*rerun the same command"):
        reads.read(result.cursor)


def test_a_read_error_that_is_not_an_outage_is_raised_at_once(tmp_path):
    buffer = _buffer(tmp_path)
    reads = BufferReads(Flaky(buffer, 1, message="Error opening: not a zarr array"), group_size=2)
    with pytest.raises(ValueError, match="not a zarr array"):
        reads.read(None)
