"""launch/rollout.py: hand-started workers on a "remote" node play into the trainer's buffer through the policy
server's transport, stop cleanly on SIGTERM, and refuse to start without a server, token or buffer; with
--workdir they join from the run's published files (WORKDIR/transport.json + transport.token), PLAIN or CurveZMQ."""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from configs.constT10 import get_config
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout.published import read_published
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from jaxwebrl.rollout.serving import PolicyService
from jaxwebrl.rollout.spec import run_fingerprint
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


def play_then_stop(proc, path, episodes: int) -> str:
    """Wait until the buffer at `path` holds `episodes` episodes (the workers must stay up), then SIGTERM them;
    returns their output."""
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and count_episodes(path) < episodes:
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()


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
        output = play_then_stop(proc, path, config.env.group_size)
    assert proc.returncode == 0, output[-3000:]
    episodes, _ = RingBuffer.open(path).read()
    assert len(episodes) >= config.env.group_size
    assert {e.info["worker_id"] for e in episodes} == {7}
    assert all(v == 2 for e in episodes for step in (s.versions for s in e.steps) for v in step[step >= 0])


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
    (["--server=tcp://127.0.0.1:5555", "--buffer=BUFFER", "--server_key=not-a-key"], "t",
     "--server_key must be a CurveZMQ key"),
])
def test_bad_flags_fail_in_one_line(args, token, expected, tmp_path):
    open_or_create(get_config("toy"), str(tmp_path))
    args = [a.replace("BUFFER", str(tmp_path / "buffer")) for a in args]
    proc = launch(*args, token=token)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1 and expected in output, output
    assert output.strip().splitlines()[-1].startswith("rollout error: ")


def _published_service(workdir, *, curve, version=3):
    """A toy policy service of a "running training run" in `workdir`: its buffer, and its published transport."""
    buffer = open_or_create(get_config("toy"), str(workdir))
    backend = ScriptedBackend(toy_oracle_responder(epsilon=0.5), fetch_image=buffer.screenshots.get, version=version)
    return PolicyService(backend, curve=curve)


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_a_hand_started_worker_joins_a_run_from_its_published_files(curve, tmp_path):
    path = os.path.join(str(tmp_path), "buffer")
    with _published_service(tmp_path, curve=curve) as service:
        service.start()
        service.publish(str(tmp_path), run_fingerprint(get_config("toy")), range(4))   # the same recipe joins
        assert stat.S_IMODE(os.stat(tmp_path / "transport.token").st_mode) == 0o600
        published = json.loads((tmp_path / "transport.json").read_text())
        assert published["address"] == service.address and (published["server_key"] is not None) == curve
        assert published["worker_ids"] == [0, 4] and read_published(str(tmp_path))["worker_ids"] == range(4)
        assert service.token not in (tmp_path / "transport.json").read_text()
        ids = ["--first_worker_id=5"] if curve else []   # no token, no server; plain: ids left to the node
        proc = launch(f"--workdir={tmp_path}", "--num_workers=1", *ids)
        output = play_then_stop(proc, path, 2)
    assert proc.returncode == 0, output[-3000:]
    episodes, _ = RingBuffer.open(path).read()
    worker_ids = {e.info["worker_id"] for e in episodes}
    assert len(episodes) >= 2 and len(worker_ids) == 1, worker_ids
    if curve:
        assert worker_ids == {5}
    else:   # a random block of 1,024 past the run's own 0-3
        assert min(worker_ids) >= 4 + 1024 and (min(worker_ids) - 4) % 1024 == 0, worker_ids
    assert all(v == 3 for e in episodes for step in (s.versions for s in e.steps) for v in step[step >= 0])


def test_a_joining_node_whose_worker_ids_overlap_the_runs_own_is_refused_in_one_line(tmp_path):
    with _published_service(tmp_path, curve=False) as service:
        service.start()
        service.publish(str(tmp_path), run_fingerprint(get_config("toy")), range(8))
        proc = launch(f"--workdir={tmp_path}", "--num_workers=2", "--first_worker_id=6")
        output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 1, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        "rollout error: --first_worker_id=6: this node's worker ids 6-7 overlap the run's own workers' 0-7 (ids seed "
        "the task draw and key admission): use --first_worker_id=8 or more, or leave it out")


def test_a_wrong_token_file_is_refused_and_a_missing_or_open_one_is_one_line(tmp_path):
    with _published_service(tmp_path, curve=True) as service:
        service.start()
        service.publish(str(tmp_path))
        token_file = tmp_path / "transport.token"
        token_file.write_text(new_token())                   # wrong token, still 0600
        proc = launch(f"--workdir={tmp_path}", "--num_workers=1")
        try:
            output = proc.communicate(timeout=150)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 78 and "wrong token" in output, output[-3000:]
        assert service.transport.requests_refused >= 1
    os.chmod(token_file, 0o644)
    cases = [(tmp_path, "transport.token: readable by others (mode 644): chmod 600"),
             (tmp_path / "elsewhere", "transport.json: No such file or directory: start the training run first")]
    for workdir, expected in cases:
        proc = launch(f"--workdir={workdir}", "--num_workers=1")
        output = proc.communicate(timeout=120)[0]
        assert proc.returncode == 1 and expected in output, output
        assert output.strip().splitlines()[-1].startswith(f"rollout error: --workdir={workdir}: ")


def test_a_joining_host_whose_config_differs_from_the_run_is_refused_naming_the_keys(tmp_path):
    """Issue 32.5: a host with group_size=2 ran 60 s unnoticed (its episodes never trained); another died on a
    screenshot shape. The run publishes its fingerprint; a host that differs stops in one line naming the keys."""
    with _published_service(tmp_path, curve=False) as service:
        service.start()
        service.publish(str(tmp_path), run_fingerprint(get_config("toy")))
        assert read_published(str(tmp_path))["fingerprint"]["group_size"] == get_config("toy").env.group_size
        proc = launch(f"--workdir={tmp_path}", "--num_workers=1", "--config.env.group_size=3",
                      "--config.env.screenshot_height=48")
        try:
            output = proc.communicate(timeout=120)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 1, output[-3000:]
    line = output.strip().splitlines()[-1]
    assert line.startswith(f"rollout error: --workdir={tmp_path}: this host's config does not match the run")
    assert "group_size: run 4, this host 3" in line and "screenshot_shape: run [64, 64], this host [48, 64]" in line
    assert "variant" not in line and "grammar" not in line
    assert count_episodes(os.path.join(str(tmp_path), "buffer")) == 0
