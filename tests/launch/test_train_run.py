"""launch/train.py end to end: the contract run, a killed rollout worker replaced, a killed trainer resumed with
no episode trained twice, and no process left behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jaxwebrl.rollout.worker_process import WORKER_EXIT_S
from jaxwebrl.train.metrics import DASHBOARD_KEYS, read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One length group for the tests' short launches (a few updates): they test launchers and recipes, not the grouped
# update (tests/train/test_update_layout.py does), and a grouped layout compiles for longer (on the bench's batch ~13 s
# with one group, ~23 s with the tiny recipe's 4: docs/results/house/length_groups_update_ab.json), paid back only
# over many updates. Learning runs keep the recipes' groups.
ONE_GROUP = "--config.train.length_groups=1"
SMALL = ["--config.train.consumer_batch_size=4", "--config.env.group_size=2", "--config.train.ppo_n_epochs=1",
         "--config.metrics.progress_bar=False", "--config.rollout.server_max_batch=2", ONE_GROUP]
TOY = ["--config=configs/constT10.py:toy", "--config.buffer.max_seq_len=512",
       "--config.env.system_prompt=Press the buttons of the pattern. Reply: Memory: {} then Action: click(x, y)."]


def start(workdir, *args):
    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--workdir={workdir}", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout_s, proc=None, what=""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"run exited ({proc.returncode}) before {what}:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def worker_stats(workdir):
    out = []
    stats_dir = os.path.join(workdir, "rollout_stats")
    for name in os.listdir(stats_dir) if os.path.isdir(stats_dir) else []:
        try:
            with open(os.path.join(stats_dir, name)) as f:
                out.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            pass
    return out


def checkpoint_steps(workdir):
    path = os.path.join(workdir, "checkpoints")
    return sorted(int(d) for d in os.listdir(path) if d.isdigit()) if os.path.isdir(path) else []


def alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_gone(pids, timeout_s=WORKER_EXIT_S + 5):
    """Every pid exits by itself within timeout_s: a worker that outlives its trainer is an orphan. Exiting takes
    a moment (closing browsers, finalising JAX), seconds when the machine's two cores are busy with a neighbour."""
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pids), f"processes left behind after {timeout_s} s: {alive(pids)}"


@pytest.mark.slow
def test_killed_worker_replaced_and_killed_trainer_resumes_exactly_once(tmp_path):
    workdir = str(tmp_path / "run")
    proc = start(workdir, *TOY, *SMALL, "--config.train.max_steps=50")  # killed long before
    try:
        wait_for(lambda: len({s["worker_id"] for s in worker_stats(workdir)}) == 2, 600, proc, "both workers")
        victim = next(s["pid"] for s in worker_stats(workdir) if s["worker_id"] == 0)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: any(s["worker_id"] == 0 and s["incarnation"] >= 1 for s in worker_stats(workdir)), 600,
                 proc, "the replacement of the killed worker")
        wait_for(lambda: checkpoint_steps(workdir), 900, proc, "a first checkpoint")
        workers = [s["pid"] for s in worker_stats(workdir)]
        proc.kill()  # SIGKILL the trainer (and the policy server in it) mid-run
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_gone(workers)  # its workers die with it
    restored = max(checkpoint_steps(workdir))
    first_run = proc.stdout.read()

    final = restored + 1
    proc = start(workdir, *TOY, *SMALL, f"--config.train.max_steps={final}")
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-3000:]
    assert_gone([s["pid"] for s in worker_stats(workdir)])
    records = read_metrics(workdir)
    assert [r["step"] for r in records] == list(range(1, final + 1))
    assert not [k for k in DASHBOARD_KEYS if k not in records[-1]]
    with open(os.path.join(workdir, "trained_episodes.jsonl")) as f:
        trained = [json.loads(line) for line in f]
    assert [t["step"] for t in trained] == list(range(1, final + 1))
    ids = [i for t in trained for i in t["episode_ids"]]
    assert len(ids) == len(set(ids)), "an episode was trained twice"
    assert max(checkpoint_steps(workdir)) == final
    # the restarted pool's workers (incarnation 0 again) get a new seed: they do not replay the run's first instances
    seeds = [int(re.search(r"rollout workers started \(.*?seed (\d+)", run).group(1)) for run in (first_run, out)]
    assert seeds[0] == 0 and seeds[1] != seeds[0], seeds   # the recipe's seed on the fresh buffer, then another
    exposed = [f"{root}/{name}" for root, dirs, files in os.walk(workdir) for name in dirs + files
               if os.stat(os.path.join(root, name)).st_mode & 0o077]
    assert not exposed, f"run files readable by others: {exposed[:5]}"   # 0600 files, 0700 directories


@pytest.mark.slow
@pytest.mark.browser
def test_default_config_contract_run(tmp_path):
    """The contract: the default (tiny, MiniWoB++ in headless Chromium) config stops by itself after N updates."""
    workdir = str(tmp_path / "run")
    proc = start(workdir, "--config=configs/constT10.py", *SMALL, "--config.env.tasks=miniwob/click-test",
                 "--config.train.max_steps=1", "--config.train.dynamic_sampling=False")
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-3000:]
    records = read_metrics(workdir)
    assert [r["step"] for r in records] == [1]
    assert not [k for k in DASHBOARD_KEYS if k not in records[0]]
    assert checkpoint_steps(workdir) == [1]
    stats = worker_stats(workdir)
    assert stats and sum(s["episodes"] for s in stats) >= 4
    assert_gone([s["pid"] for s in stats])
    leftover = [p.pid for p in psutil.process_iter(["cmdline"]) if workdir in " ".join(p.info["cmdline"] or [])]
    assert not leftover
