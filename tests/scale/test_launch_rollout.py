"""launch/rollout.py: hand-started workers on a "remote" node play into the trainer's buffer through the policy
server's transport, stop cleanly on SIGTERM, and refuse to start without a server, token or buffer."""

import os
import signal
import subprocess
import sys
import time

import pytest

from configs.constT10 import get_config
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from jaxwebrl.rollout.transport import TransportServer, new_token
from jaxwebrl.buffer.from_config import open_or_create

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "launch", "rollout.py")


def launch(*args, token=None, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("JAXWEBRL_TOKEN", None)
    if token is not None:
        env["JAXWEBRL_TOKEN"] = token
    return subprocess.Popen([sys.executable, SCRIPT, "--config=configs/constT10.py:toy", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def count_episodes(path) -> int:
    episodes, _ = RingBuffer.open(path).read()
    return len(episodes)


@pytest.mark.parametrize("launcher", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_hand_started_workers_fill_the_buffer_and_stop_on_sigterm(launcher, tmp_path):
    if launcher == "ray":
        pytest.importorskip("ray", reason='--launcher=ray needs Ray: pip install "ray==2.60.0"')
    config = get_config("toy")
    buffer = open_or_create(config, str(tmp_path))  # what the trainer creates in its workdir
    path = os.path.join(str(tmp_path), "buffer")
    token = new_token()
    backend = ScriptedBackend(toy_oracle_responder(epsilon=0.5), fetch_image=buffer.screenshots.get, version=2)
    with TransportServer(backend, token=token) as server:
        proc = launch(f"--server={server.address}", f"--buffer={path}", "--num_workers=1", "--first_worker_id=7",
                      f"--launcher={launcher}", token=token)
        try:
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and count_episodes(path) < config.env.group_size:
                assert proc.poll() is None, proc.communicate()[0][-3000:]
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=60)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, output[-3000:]
    episodes, _ = RingBuffer.open(path).read()
    assert len(episodes) >= config.env.group_size
    assert {e["info"]["worker_id"] for e in episodes} == {7}
    assert all(v == 2 for e in episodes for step in e["versions"] for v in step[step >= 0])


def test_wrong_token_exits_fatal(tmp_path):
    open_or_create(get_config("toy"), str(tmp_path))
    with TransportServer(ScriptedBackend(toy_oracle_responder()), token=new_token()) as server:
        proc = launch(f"--server={server.address}", f"--buffer={tmp_path / 'buffer'}", "--num_workers=1",
                      token=new_token())
        try:
            output = proc.communicate(timeout=150)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 78, output[-3000:]
    assert "refused" in output or "fatal" in output


@pytest.mark.parametrize("args, token, expected", [
    (["--buffer=/tmp"], "t", "--server=None"),
    (["--server=tcp://127.0.0.1:5555", "--buffer=/nonexistent/buffer"], "t", "cannot open the ring buffer"),
    (["--server=tcp://127.0.0.1:5555", "--buffer=BUFFER"], None, "no token"),
])
def test_bad_flags_fail_in_one_line(args, token, expected, tmp_path):
    open_or_create(get_config("toy"), str(tmp_path))
    args = [a.replace("BUFFER", str(tmp_path / "buffer")) for a in args]
    proc = launch(*args, token=token)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1 and expected in output, output
    assert output.strip().splitlines()[-1].startswith("rollout error: ")
