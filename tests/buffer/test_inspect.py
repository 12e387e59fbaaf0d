"""`python -m jaxwebrl.buffer.inspect DIR`: the JSON summary a user runs first."""

import json
import os
import subprocess
import sys

import numpy as np

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.inspect import summarize
from tests.buffer.factory import SHAPE, make_episode

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_summary_numbers(tmp_path):
    buf = RingBuffer.create(tmp_path / "buf", capacity_steps=10, max_seq_len=48, screenshot_shape=SHAPE,
                            capacity_screenshots=40, max_images_per_step=2)
    sent = [make_episode(seed, num_steps=3, version=seed) for seed in range(5)]
    for ep in sent:
        buf.append(ep)
    buf.reservations.reserve(2, 0)  # a writer that reserved and died: orphaned slots
    s = summarize(buf)
    live = sent[-2:]  # 17 steps reserved in a ring of 10: only the last two episodes are intact
    assert s["committed_episodes"] == 2 and s["committed_steps"] == 6
    assert s["versions"] == {"min": 3, "max": 5}
    assert np.isclose(s["reward_mean"], np.mean([ep.reward for ep in live]))
    assert s["cursor_range"] == {"oldest": 3, "next": 5}
    assert s["reserved"] == {"steps": 17, "shots": buf.reservations.heads()["shots"]}
    assert s["orphaned_steps"] == 2 and s["in_flight_steps"] == 0


def test_cli_prints_json_and_refuses_foreign_dirs(tmp_path):
    RingBuffer.create(tmp_path / "buf", capacity_steps=16, max_seq_len=48, screenshot_shape=SHAPE,
                      max_images_per_step=2).append(make_episode(1))
    run = lambda p: subprocess.run([sys.executable, "-m", "jaxwebrl.buffer.inspect", str(p)], capture_output=True,
                                   text=True, timeout=60, cwd=REPO)
    ok = run(tmp_path / "buf")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["committed_episodes"] == 1
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    bad = run(tmp_path / "foreign")
    assert bad.returncode == 2 and "not a jaxwebrl ring buffer" in bad.stderr
