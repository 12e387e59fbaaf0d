"""Real spawned writer processes: concurrent writers with a live reader, and SIGKILL mid-append."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer

from jaxwebrl.buffer.screenshots import ScreenshotOverwritten
from tests.buffer import workers
from tests.buffer.factory import SHAPE, assert_same_episode, make_episode

SPAWN = multiprocessing.get_context("spawn")


def inspect_json(path) -> dict:
    out = subprocess.run([sys.executable, "-m", "jaxwebrl.buffer.inspect", str(path)], capture_output=True,
                         text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("direct_file_io", [True, False], ids=["flock", "tensorstore_cas"])
def test_concurrent_writers_with_live_reader(tmp_path, direct_file_io):
    path = str(tmp_path / "buf")
    buf = RingBuffer.create(path, capacity_steps=512, max_seq_len=48, screenshot_shape=SHAPE,
                            capacity_screenshots=512, max_images_per_step=2, direct_file_io=direct_file_io)
    seed_sets = [list(range(w * 100, w * 100 + 12)) for w in range(3)]
    procs = [SPAWN.Process(target=workers.append_seeds, args=(path, seeds, 3)) for seeds in seed_sets]
    for p in procs:
        p.start()
    seen, cursor, deadline = [], None, time.time() + 120
    reader = RingBuffer.open(path)
    while len(seen) < 36 and time.time() < deadline:
        episodes, cursor = reader.read(since=cursor if cursor else 0)
        for ep in episodes:  # every episode the reader sees mid-flight is whole
            assert_same_episode(ep, make_episode(ep.info["seed"], num_steps=3, group_id=ep.info["seed"]),
                                reader.screenshots)
        seen += [ep.info["seed"] for ep in episodes]
        time.sleep(0.01)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seen += [ep.info["seed"] for ep in reader.read(since=cursor).episodes]
    assert sorted(seen) == sorted(sum(seed_sets, []))  # exactly once each
    for seeds in seed_sets:  # each writer's episodes in its own commit order
        mine = [s for s in seen if s in seeds]
        assert mine == seeds
    assert buf.reservations.heads()["steps"] == 36 * 3
    assert inspect_json(path)["orphaned_steps"] == 0


@pytest.mark.slow
def test_sigkill_during_append_leaves_nothing_partial(tmp_path):
    path = str(tmp_path / "buf")
    RingBuffer.create(path, capacity_steps=256, max_seq_len=48, screenshot_shape=workers.KILL_SHAPE,
                      capacity_screenshots=320, max_images_per_step=2)
    reader = RingBuffer.open(path)
    cursor, kill_points = 0, np.linspace(0.0, 1.5, 10)
    for k, fraction in enumerate(kill_points):  # kill points spread over one and a half appends
        started, committed = SPAWN.Event(), SPAWN.Value("i", 0)
        first_seed = 1000 * (k + 1)
        proc = SPAWN.Process(target=workers.append_until_killed, args=(path, first_seed, started, committed))
        proc.start()
        assert started.wait(60)
        marks = {}
        while len(marks) < 2:  # time two appends of the warm writer, then kill a fraction into the next
            assert proc.is_alive(), f"the writer died before it was killed (exit code {proc.exitcode})"
            n = committed.value
            if n >= 1 and 1 not in marks:
                marks[1] = time.perf_counter()
            if n >= 3:
                marks[3] = time.perf_counter()
            time.sleep(0.0002)
        time.sleep((marks[3] - marks[1]) / 2 * fraction)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        episodes, cursor = reader.read(since=cursor)
        seeds = [ep.info["seed"] for ep in episodes]
        # the appends that returned are visible; at most one more (killed after its commit record)
        assert seeds[:committed.value] == list(range(first_seed, first_seed + committed.value))
        assert len(seeds) - committed.value in (0, 1)
        assert seeds == list(range(first_seed, first_seed + len(seeds)))
        for ep in episodes:
            assert_same_episode(ep, make_episode(ep.info["seed"], num_steps=4, shape=workers.KILL_SHAPE,
                                                 group_id=ep.info["seed"]), reader.screenshots)
    after_kills = inspect_json(path)
    orphans_after_kills = after_kills["orphaned_steps"]
    assert after_kills["temp_files"] <= len(kill_points)  # at most one half-written file per killed writer
    # later appends succeed, and the ring reclaims orphaned slots on its next lap
    writer = RingBuffer.open(path)
    for seed in range(70):
        writer.append(make_episode(seed, num_steps=4, shape=workers.KILL_SHAPE, group_id=seed))
    episodes, cursor = reader.read(since=cursor)
    assert [ep.info["seed"] for ep in episodes][-60:] == list(range(10, 70))
    summary = inspect_json(path)
    assert summary["orphaned_steps"] == 0 and summary["committed_episodes"] == 64
    assert orphans_after_kills > 0  # killed mid-append: reserved, never committed, reported


def test_reader_under_wrap_around_never_sees_a_mix(tmp_path):
    """Two writers lap a tiny ring many times while a reader keeps reading: every episode it returns
    is exactly what its writer sent, and every committed episode is accounted for."""
    path = str(tmp_path / "buf")
    RingBuffer.create(path, capacity_steps=24, max_seq_len=48, screenshot_shape=SHAPE, capacity_screenshots=40,
                      max_images_per_step=2)
    overruns = SPAWN.Value("i", 0)
    seed_sets = [list(range(w * 1000, w * 1000 + 40)) for w in range(2)]
    procs = [SPAWN.Process(target=workers.append_seeds_counting_overruns, args=(path, seeds, 3, overruns))
             for seeds in seed_sets]
    for p in procs:
        p.start()
    reader = RingBuffer.open(path)
    cursor, returned, rounds = 0, 0, 0
    while True:
        done = all(not p.is_alive() for p in procs)
        episodes, cursor = reader.read(since=cursor)
        for ep in episodes:
            sent = make_episode(ep.info["seed"], num_steps=3, group_id=ep.info["seed"])
            try:
                assert_same_episode(ep, sent, reader.screenshots)
            except ScreenshotOverwritten:  # pixels lapped after the read (rows were checked before)
                continue
        returned += len(episodes)
        if done:
            break
        rounds += 1
        time.sleep(0.2 if rounds % 3 == 0 else 0.002)  # now and then lag behind, so writers lap the reader
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    stats = reader.stats
    assert stats["overwritten"] + stats["lost"] > 0  # the ring really wrapped under the reader
    assert returned + stats["overwritten"] + stats["lost"] == 80 - overruns.value
    assert returned == stats["returned"] and returned > 0
