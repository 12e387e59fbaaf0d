"""A full disk under the ring buffer (a real tmpfs filled up): appends fail as one-line BufferWriteErrors with
nothing visible and nothing half-written left, recover once space is back, and rollout workers drop episodes with
a counted reason, then stop for good (no crash-restart loop) when the disk stays full."""

import os
import time

import numpy as np
import pytest

from jaxwebrl.buffer.schema import BufferWriteError

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout.pool import WorkerPool
from tests.buffer.factory import SHAPE, make_episode
from tests.disks import fill, tmpfs


def test_append_on_a_full_disk_is_one_line_leaves_nothing_and_recovers(tmp_path):
    with tmpfs(tmp_path / "disk", 1024) as disk:
        path = os.path.join(disk, "buf")
        buf = RingBuffer.create(path, capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE,
                                max_images_per_step=2)
        first = buf.append(make_episode(0, num_steps=2))
        fill(disk)
        heads = buf.reservations.heads()
        for attempt in range(3):
            with pytest.raises(BufferWriteError, match=r"cannot write the ring buffer at .*No space left on device.*"
                                                       r"free space on that disk") as err:
                buf.append(make_episode(1 + attempt, num_steps=2))
            assert "\n" not in str(err.value)
        with pytest.raises(BufferWriteError, match="No space left"):
            buf.screenshots.put(np.zeros(SHAPE, np.uint8) + 9)
        assert [e.episode_id for e in RingBuffer.open(path).read().episodes] == [first]
        temp = [n for root, _, names in os.walk(path) for n in names if ".__tmp" in n]
        assert not temp, temp                                  # failed writes leave no temp files
        assert buf.reservations.heads()["steps"] >= heads["steps"]
        os.unlink(os.path.join(disk, "filler"))
        again = buf.append(make_episode(5, num_steps=2))     # space is back: the buffer works as before
        assert [e.episode_id for e in RingBuffer.open(path).read().episodes] == [first, again]


def test_workers_on_a_full_disk_drop_count_and_stop_instead_of_crash_looping(tmp_path, capfd):
    with tmpfs(tmp_path / "disk", 640) as disk:
        path = os.path.join(disk, "buf")
        RingBuffer.create(path, capacity_steps=512, max_seq_len=1024, screenshot_shape=(64, 64, 3),
                          max_images_per_step=2)
        fill(disk)
        spec = {"worker": {"tasks": ["toy"], "group_size": 2, "max_new_tokens": 64, "prompt": {"window": 1},
                           "max_buffer_failures": 3, "buffer_retry_s": 0.05},
                "policy": {"kind": "scripted", "responder": "toy_oracle", "epsilon": 0.5},
                "buffer": {"path": path}, "stats_dir": str(tmp_path / "stats")}
        with WorkerPool(spec, num_workers=1, min_uptime_s=0.5, max_backoff_s=0.5) as pool:
            deadline = time.monotonic() + 90
            while not pool.fatal and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1.0)   # a crash-looping worker would have been restarted by now
            assert pool.fatal and pool.restarts == 0, (pool.fatal, pool.restarts)
            with pytest.raises(RuntimeError, match="rollout workers stopped for good"):
                pool.raise_if_failed()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    dropped = [line for line in err.splitlines() if "episode dropped" in line]
    assert len(dropped) == 2 and all("No space left on device" in line for line in dropped), err[-3000:]
    stop = [line for line in err.splitlines() if "stops for good" in line]
    assert len(stop) == 1 and "3 episodes in a row could not be appended" in stop[0], err[-3000:]
