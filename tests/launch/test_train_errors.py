"""launch/train.py: what the user or the machine causes at run time (a held lock, a read-only workdir, unreadable
checkpoints) is one line and exit code 1, never a traceback; the files a run writes are its owner's alone."""

import os
import stat
import subprocess
import sys

import pytest

from jaxwebrl.train.workdir import workdir_lock
from tests.disks import remount_read_only, tmpfs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY = ["--config=configs/constT10.py:toy", "--config.buffer.max_seq_len=512", "--config.metrics.progress_bar=False"]
HOLD = "import sys, time; from jaxwebrl.train.workdir import workdir_lock\n" \
       "with workdir_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)"


def launch(workdir, *args):
    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--workdir={workdir}", *TOY, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))


def the_error(proc) -> str:
    """The single `error:` line of a failed run (its other stderr lines are ordinary log lines)."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr[-3000:]
    return errors[0]


def test_a_held_workdir_lock_is_one_line(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert holder.stdout.readline().strip() == "held"
        line = the_error(launch(tmp_path))
        assert f"workdir {tmp_path} is in use by another training run (pid {holder.pid})" in line
        assert "--workdir" in line
    finally:
        holder.kill()
        holder.wait()


def test_a_buffer_held_by_another_run_is_one_line(tmp_path):
    """Issue 32: a second run with its own workdir and the first one's buffer.path trained the same episodes."""
    shared = tmp_path / "shared_buffer"
    hold = "import sys, time; from jaxwebrl.buffer.owner import trainer_lock\n" \
           "with trainer_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(shared)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = launch(tmp_path / "second", f"--config.buffer.path={shared}")
        line = the_error(proc)
        assert f"ring buffer file:{shared} is in use by another training run (pid {holder.pid} on host " in line
        assert "--config.buffer.path" in line
        assert not os.path.exists(tmp_path / "second")   # issue 44.8: refused, its new workdir is gone again
        assert "TPU accelerator type" not in proc.stderr   # no libtpu start-up noise on a machine without a TPU
    finally:
        holder.kill()
        holder.wait()


def test_a_read_only_workdir_is_one_line_naming_path_and_fix(tmp_path):
    with tmpfs(tmp_path / "ro", 1024) as disk:
        os.makedirs(os.path.join(disk, "run"))
        remount_read_only(disk)
        line = the_error(launch(os.path.join(disk, "run")))
    assert f"workdir {disk}/run is not writable (Read-only file system" in line
    assert "read-only filesystem: pass a --workdir on a writable disk" in line


def test_unreadable_checkpoints_are_one_line_and_run_files_are_private(tmp_path):
    from tests.train.test_checkpoint_faults import save_steps

    workdir = tmp_path / "run"
    save_steps(workdir / "checkpoints", [1, 2])      # another model's state: nothing restores into this config
    line = the_error(launch(workdir))
    assert f"no checkpoint under {workdir}/checkpoints can be restored (step 2: " in line
    assert "use a new --workdir" in line
    made = [p for p in workdir.rglob("*") if "checkpoints" not in p.relative_to(workdir).parts]
    assert any(p.name == "buffer.json" for p in made) and any(p.name == "train.lock" for p in made)
    exposed = [f"{p} {oct(stat.S_IMODE(p.stat().st_mode))}" for p in made if p.stat().st_mode & 0o077]
    assert not exposed, exposed                       # files 0600, directories 0700 (the buffer's included)


def test_a_first_step_longer_than_the_buffer_row_is_one_line_before_any_worker_starts(tmp_path):
    """Issue 32.3: a run that cannot fit its first step says so and stops, naming the knob."""
    line = the_error(launch(tmp_path / "run", "--config.buffer.max_seq_len=100"))
    assert "the first step of toy needs" in line and "--config.buffer.max_seq_len=" in line
    assert not os.path.exists(tmp_path / "run" / "rollout_stats")   # no worker was started
