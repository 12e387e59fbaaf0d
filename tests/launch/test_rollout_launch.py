"""launch/rollout.py by hand: it says what it does on stderr (absl owns the root logger), and gives up, naming the
address, on a trainer that is gone instead of retrying its address for ever (issue 44.7)."""

import os
import re
import socket
import subprocess
import sys
import time

from configs.constT10 import get_config
from jaxwebrl.buffer.from_config import open_or_create
from jaxwebrl.rollout.transport import new_token
from jaxwebrl.rollout.worker_process import EXIT_FATAL

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_rollout_node_whose_trainer_is_gone_says_so_and_stops(tmp_path):
    open_or_create(get_config("toy"), str(tmp_path / "run"))    # the run's buffer, as its trainer made it
    with socket.socket() as s:   # a port nothing listens on: the trainer that published it is gone
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    env = dict(os.environ, PYTHONPATH=REPO, JAXWEBRL_TOKEN=new_token())
    start = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", "rollout.py"),
                           "--config=configs/constT10.py:toy", f"--server={address}",
                           f"--buffer={tmp_path / 'run' / 'buffer'}", "--num_workers=1", "--give_up_after_s=2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    assert proc.returncode == EXIT_FATAL, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    started = [re.search(rf"starting 1 rollout workers \(ids (\d+)\.\.\1\) against {re.escape(address)}", line)
               for line in lines]
    first = [int(m.group(1)) for m in started if m]   # no run published its own ids: a random block of 1,024
    assert len(first) == 1 and first[0] >= 1024 and first[0] % 1024 == 0, proc.stderr
    (last,) = [line for line in lines if "ERROR jaxwebrl.launch.rollout" in line]
    assert f"nothing has listened at the policy server's address {address}" in last and "trainer is gone" in last
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert took < 120, took
