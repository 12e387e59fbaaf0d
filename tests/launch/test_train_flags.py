"""launch/train.py refuses bad configs before any browser or device work, with one line naming the key and fix."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(*args, workdir):
    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--workdir={workdir}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("args, expected", [
    (["--config=configs/constT10.py", "--config.train.max_stepz=3"], "unknown config key 'train.max_stepz'"),
    (["--config=configs/constT10.py", "--config.actor.c_clip=0.9"], "actor.c_clip=0.9: the dual clip must be > 1"),
    (["--config=configs/sapo.py", "--config.actor.use_decoupled_loss=True"], "actor.use_decoupled_loss=True"),
    (["--config=configs/constT10.py:qwen3vl_8b", "--config.model.checkpoint=/nonexistent/Qwen3-VL-8B"],
     "model.checkpoint='/nonexistent/Qwen3-VL-8B': directory not found"),
    (["--config=configs/constT10.py", "--config.env.chromium=/nonexistent/chromium"], "Chromium not found"),
    (["--config=configs/constT10.py:nope"], "unknown config variant 'nope'"),
])
def test_bad_config_is_one_line_and_nothing_starts(args, expected, tmp_path):
    workdir = tmp_path / "run"
    proc = launch(*args, workdir=workdir)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: ") and expected in lines[0], proc.stderr
    assert not workdir.exists()  # nothing was started or written


def test_print_config_help_lists_every_field_with_its_value_and_help(tmp_path):
    """`--print_config_help` needs no workdir, prints `key = value  # help` a field (the declared default where the
    value differs from it), exits 0 and starts nothing."""
    from configs import base

    cmd = [sys.executable, os.path.join(REPO, "launch", "train.py"), "--config=configs/constT10.py:toy",
           "--config.train.lr=1e-05", "--print_config_help"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(base.FIELDS)
    assert "train.lr = 1e-05  # AdamW learning rate (default 5e-06)" in lines
    tasks = base.FIELDS["env.tasks"].help
    assert tasks.startswith("comma-separated env specs: 'toy', 'miniwob/<task>'")
    assert f"env.tasks = 'toy'  # {tasks} (default 'miniwob/click-tab,miniwob/click-dialog,miniwob/click-dialog-2')" \
        in lines
    cap = base.FIELDS["actor.behav_imp_weight_cap"].help
    assert f"actor.behav_imp_weight_cap = 5.0  # {cap}" in lines and "> 1" in cap
    assert any(line.startswith("metrics.sample_episodes_every = 50  # every N train steps") for line in lines)
