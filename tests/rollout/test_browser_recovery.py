"""Real headless Chromium: killing the browser mid-episode (in-process worker, and a SIGKILLed pool worker)."""

import glob
import os
import signal
import tempfile
import time

import numpy as np
import psutil
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env.registry import make_env
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.pool import WorkerPool, read_stats
from jaxwebrl.rollout.scripted import ScriptedBackend, random_choice_responder
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig

pytestmark = pytest.mark.browser

MISSING_CLICK = "click(20, 980)"  # bottom-left corner of click-test: never the button, so episodes run long


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def make_buffer(path):
    return RingBuffer.create(path, capacity_steps=256, max_seq_len=2048, screenshot_shape=(64, 64, 3),
                             max_images_per_step=2)


def test_killing_chromium_mid_episode_flags_the_episode_and_the_worker_recovers(tmp_path):
    buffer = make_buffer(str(tmp_path / "buf"))
    envs = []

    def env_factory(spec):
        env = make_env(spec, screenshot_size=(64, 64), max_steps=3)
        envs.append(env)
        return env

    backend = ScriptedBackend(random_choice_responder([MISSING_CLICK]), fetch_image=buffer.screenshots.get)
    inner = InProcessClient(backend)
    killed = []

    class KillChromiumOnSecondCall:
        calls = 0

        def generate(self, *args, **kwargs):
            KillChromiumOnSecondCall.calls += 1
            if KillChromiumOnSecondCall.calls == 2:  # episode 1, step 2: after its screenshot, before its action
                browser = envs[0].browser
                killed.extend(browser.process_ids())
                os.kill(browser.chromium_pid(), signal.SIGKILL)
            return inner.generate(*args, **kwargs)

    config = WorkerConfig(tasks=("miniwob/click-test",), group_size=2, max_new_tokens=64, prompt={"window": 1},
                          step_timeout_s=60)
    worker = RolloutWorker(config, KillChromiumOnSecondCall(), buffer, env_factory=env_factory)
    try:
        worker.run(max_groups=1)
    finally:
        worker.close()
    episodes, _ = RingBuffer.open(str(tmp_path / "buf")).read(group_size=2)
    assert len(episodes) == 2 and len({e.group_id for e in episodes}) == 1
    failed, healthy = episodes
    assert failed.env_failed and failed.num_steps == 1 and failed.reward == 0.0
    assert "BrowserCrashed" in failed.info["env_failure"] or "EnvTimeout" in failed.info["env_failure"]
    assert not healthy.env_failed and healthy.num_steps == 3 and healthy.truncated
    assert worker.stats.env_failures == 1 and len(envs) == 2  # a fresh env (browser) after the crash
    for episode in episodes:  # every stored screenshot ref still resolves to real pixels
        for ref in episode.screenshot_refs[episode.screenshot_refs >= 0]:
            shot = buffer.screenshots.get(int(ref))
            assert shot.shape == (64, 64, 3) and shot.std() > 0
    time.sleep(0.5)
    assert killed and not any(alive(pid) for pid in killed)
    assert not any(alive(pid) for env in envs for pid in ([] if env.browser is None else env.browser.process_ids()))


@pytest.mark.slow
def test_sigkilled_pool_worker_takes_no_browser_with_it(tmp_path):
    path = str(tmp_path / "buf")
    make_buffer(path)
    spec = {"worker": {"tasks": ["miniwob/click-test"], "group_size": 2, "max_new_tokens": 64,
                       "prompt": {"window": 1}, "env_options": {"screenshot_size": [64, 64], "max_steps": 3}},
            "policy": {"kind": "scripted", "responder": "random", "texts": [MISSING_CLICK]},
            "buffer": {"path": path}, "stats_dir": str(tmp_path / "stats")}
    with WorkerPool(spec, num_workers=1) as pool:
        deadline = time.monotonic() + 120
        while not read_stats(spec["stats_dir"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        worker_pid = pool.pids[0]
        browsers = [p.pid for p in psutil.Process(worker_pid).children(recursive=True)]
        assert any("chrom" in psutil.Process(pid).name() for pid in browsers)
        profiles = glob.glob(os.path.join(tempfile.gettempdir(), f"jaxwebrl-chromium-{worker_pid}-*"))
        assert profiles and all(os.path.isdir(os.path.join(p, "profile")) for p in profiles)
        os.kill(worker_pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in browsers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(pid) for pid in browsers)  # chromedriver and every Chromium process are gone
        while pool.pids[0] in (None, worker_pid) and time.monotonic() < deadline + 30:
            time.sleep(0.2)
        replacement = pool.pids[0]
        assert replacement not in (None, worker_pid)
        assert not any(os.path.exists(p) for p in profiles)  # the dead worker's profile went with it
        time.sleep(3)  # let the replacement start its browser, then shut everything down
        new_browsers = [p.pid for p in psutil.Process(replacement).children(recursive=True)]
    assert not alive(replacement) and not any(alive(pid) for pid in new_browsers)
    episodes, _ = RingBuffer.open(path).read()
    assert episodes and all(e.num_steps == len(e.info["steps"]) for e in episodes)


def test_miniwob_tasks_of_a_worker_share_one_browser(tmp_path):
    buffer = make_buffer(str(tmp_path / "buf"))
    backend = ScriptedBackend(random_choice_responder([MISSING_CLICK]), fetch_image=buffer.screenshots.get)
    config = WorkerConfig(tasks=("miniwob/click-test", "miniwob/click-button"), group_size=1, max_new_tokens=64,
                          prompt={"window": 1}, env_options={"screenshot_size": [64, 64], "max_steps": 2})
    worker = RolloutWorker(config, InProcessClient(backend), buffer)
    try:
        worker.run_group("miniwob/click-test", 1)
        worker.run_group("miniwob/click-button", 2)
        envs = list(worker._envs._envs.values())
        assert [e.task_id for e in envs] == ["miniwob/click-test", "miniwob/click-button"]
        assert envs[0].browser is envs[1].browser and envs[0].browser.alive
        shared = envs[0].browser
        os.kill(shared.chromium_pid(), signal.SIGKILL)  # the shared browser dies between groups
        worker.run_group("miniwob/click-test", 3)  # reset fails once, then the shared browser restarts
        assert worker.stats.env_failures == 1 and shared.alive
        pids = shared.process_ids()
    finally:
        worker.close()
    episodes, _ = buffer.read()
    assert [e.task_id for e in episodes] == ["miniwob/click-test", "miniwob/click-button", "miniwob/click-test"]
    assert all(e.num_steps == 2 and not e.env_failed for e in episodes)
    assert pids and not any(alive(pid) for pid in pids)  # worker.close() closed the shared browser


def test_fresh_envs_per_group_starts_new_browser_sessions_for_every_group(tmp_path):
    """rollout.fresh_envs_per_group (the paper's synchronous baseline: WebGym's pool rebuilt every iteration) gets
    from the run config to the worker, which closes the browser after a group and starts a new one for the next."""
    from configs.constT10 import get_config
    from jaxwebrl.rollout.spec import worker_fields

    run_config = get_config("tiny")
    assert "fresh_envs_per_group" not in worker_fields(run_config)    # off: the everlasting pool
    run_config.rollout.fresh_envs_per_group = True
    assert WorkerConfig.from_dict(worker_fields(run_config)).fresh_envs_per_group
    buffer = make_buffer(str(tmp_path / "buf"))
    backend = ScriptedBackend(random_choice_responder([MISSING_CLICK]), fetch_image=buffer.screenshots.get)
    config = WorkerConfig(tasks=("miniwob/click-test",), group_size=2, max_new_tokens=64, prompt={"window": 1},
                          env_options={"screenshot_size": [64, 64], "max_steps": 2}, fresh_envs_per_group=True)
    worker = RolloutWorker(config, InProcessClient(backend), buffer)
    browsers, pids = [], []
    try:
        for seed in (1, 2):
            worker.run_group("miniwob/click-test", seed)
            browser = worker._envs._envs["miniwob/click-test"].browser
            browsers.append(browser)
            pids.append(browser.process_ids())
        assert browsers[0] is not browsers[1] and pids[0] and pids[1]
        assert not any(alive(pid) for pid in pids[0]) and any(alive(pid) for pid in pids[1])
    finally:
        worker.close()
    assert not any(alive(pid) for pid in pids[1])
    episodes, _ = buffer.read()
    assert len(episodes) == 4 and not any(e.env_failed for e in episodes)
