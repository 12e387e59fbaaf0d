"""One training run per buffer (issue 32): a second trainer on a held buffer is refused in one line naming the
buffer, the holder and the fix; writers and read-only readers are not; a killed owner's lock is gone."""

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from jaxwebrl.buffer.owner import trainer_lock
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.schema import TRAINER_LOCK_KEY
from jaxwebrl.errors import BufferInUse, RunError
from tests.buffer.factory import SHAPE, make_episode

HOLD = "import sys, time; from jaxwebrl.buffer.owner import trainer_lock\n" \
       "with trainer_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)"


def create(path):
    return RingBuffer.create(path, capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE, capacity_screenshots=64,
                             max_images_per_step=2)


def test_a_second_trainer_is_refused_while_writers_and_readers_go_on_and_a_killed_owner_frees_it(tmp_path):
    path = str(tmp_path / "buffer")
    create(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BufferInUse) as err:
            with trainer_lock(path):
                pytest.fail("a second owner got the lock")
        message = str(err.value)
        assert isinstance(err.value, RunError) and "\n" not in message
        assert f"ring buffer file:{path} is in use by another training run " \
               f"(pid {holder.pid} on host {socket.gethostname()})" in message
        assert "--config.buffer.path" in message
        RingBuffer.open(path).append(make_episode(1))   # a rollout worker writes on
        summary = subprocess.run([sys.executable, "-m", "jaxwebrl.buffer.inspect", path], capture_output=True,
                                 text=True, timeout=120)
        assert summary.returncode == 0, summary.stderr     # a read-only reader works
        assert json.loads(summary.stdout)["committed_episodes"] == 1
    finally:
        holder.kill()   # SIGKILL: the holder never releases it, the kernel does
        holder.wait()
    with trainer_lock(path):
        with open(os.path.join(path, TRAINER_LOCK_KEY)) as f:
            assert f.read() == f"pid {os.getpid()} on host {socket.gethostname()}"
    with trainer_lock(path):   # released on exit
        pass


def test_the_lock_may_come_before_the_buffer_and_survives_an_overwrite(tmp_path):
    path = str(tmp_path / "new")
    with trainer_lock(path):   # a fresh run: locked first, created after, as the supervisor does
        buffer = create(path)
        buffer.append(make_episode(2))
        RingBuffer.create(path, capacity_steps=64, max_seq_len=48, screenshot_shape=SHAPE, overwrite=True,
                          max_images_per_step=2)
        assert os.path.isfile(os.path.join(path, TRAINER_LOCK_KEY))   # the held lock file was not deleted
        assert RingBuffer.open(path).read().episodes == []
    with pytest.raises(FileExistsError, match="already holds a jaxwebrl buffer"):
        create(path)


def test_other_kvstores_say_they_are_not_locked(caplog):
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.buffer.owner"):
        with trainer_lock("memory://owner-test/"):
            pass
    assert "memory:owner-test is not on local files: no lock keeps a second training run off it" in caplog.text
