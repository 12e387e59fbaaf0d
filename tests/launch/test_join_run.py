"""A real training run (launch/train.py, CurveZMQ on) publishes its policy server in its workdir, and a
hand-started launch/rollout.py --workdir=WORKDIR joins it: its worker's episodes land in the run's buffer."""

import json
import os
import signal
import stat
import subprocess
import sys

from jaxwebrl.buffer.ring import RingBuffer
from tests.launch.test_train_run import REPO, SMALL, TOY, start, wait_for

JOINED_ID = 50


def _joined_episodes(path) -> int:
    try:
        episodes, _ = RingBuffer.open(path).read()
    except Exception:  # noqa: BLE001 - the buffer may be mid-creation
        return 0
    return sum(e.info["worker_id"] == JOINED_ID for e in episodes)


def test_a_hand_started_worker_joins_a_running_curve_run(tmp_path):
    workdir = str(tmp_path / "run")
    train = start(workdir, *TOY, *SMALL, "--config.train.max_steps=1000", "--config.rollout.num_workers=1",
                  "--config.rollout.curve=True")
    rollout = None
    try:
        published = os.path.join(workdir, "transport.json")
        wait_for(lambda: os.path.exists(published), 600, train, "the run to publish its transport")
        info = json.loads(open(published).read())
        assert info["address"].startswith("tcp://127.0.0.1:") and len(info["server_key"]) == 40
        assert info["worker_ids"] == [0, 1]   # the run's own worker (rollout.num_workers=1): a joiner takes others
        assert stat.S_IMODE(os.stat(os.path.join(workdir, "transport.token")).st_mode) == 0o600
        env = {k: v for k, v in os.environ.items() if k != "JAXWEBRL_TOKEN"}
        env["PYTHONPATH"] = REPO
        rollout = subprocess.Popen(
            # the run's recipe and overrides: a host with another group size is refused (its fingerprint differs)
            [sys.executable, os.path.join(REPO, "launch", "rollout.py"), *TOY, *SMALL, f"--workdir={workdir}",
             "--num_workers=1", f"--first_worker_id={JOINED_ID}"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for(lambda: _joined_episodes(os.path.join(workdir, "buffer")) >= 2, 600, rollout,
                 "the joined worker's episodes")
    finally:
        for proc in (rollout, train):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=120)[0] if proc is not None else "" for proc in (rollout, train)]
    assert rollout.returncode == 0, outputs[0][-3000:]
    assert train.returncode == 0, outputs[1][-3000:]
