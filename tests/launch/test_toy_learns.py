"""The quickest end-to-end proof that the loop learns: the GRPO recipe on the browser-free toy task, from the
random tiny policy, through the real policy server, rollout workers, ring buffer, versions and trainer, until
the greedy policy solves all four instructions (each needs the right press on all three turns)."""

import json
import os
import subprocess
import sys
import time

import pytest

from jaxwebrl.env.tasks.toy import toy
from jaxwebrl.train.metrics import read_metrics
from tests.xla_flags import run_speed_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = "--config=configs/grpo.py:toy"
MAX_UPDATES = 40   # a budget, not the schedule: the run stops once its greedy policy solves the four instructions
                   # (train.stop_at_greedy_success=1: a greedy episode of each, played after every update).
                   # Earlier runs stopped on the sampled success of the episodes read (0.95 on two updates in a
                   # row): 25-27 updates, ~3 minutes, while the greedy policy had solved all four by update 12-14


def launch(script, *args, timeout):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), RECIPE, *args], cwd=REPO,
                          env=run_speed_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def greedy_success(policy, out_dir):
    """Success of each of the four instructions (seeds 0..3) under the greedy policy."""
    launch("eval.py", f"--policy={policy}", f"--out_dir={out_dir}", "--num_seeds=4", "--seed_start=0",
           "--temperature=0", timeout=600)
    with open(os.path.join(out_dir, "eval.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_grpo_learns_all_four_toy_tasks_from_scratch(tmp_path):
    workdir = str(tmp_path / "run")
    start = time.monotonic()
    launch("train.py", f"--workdir={workdir}", f"--config.train.max_steps={MAX_UPDATES}",
           "--config.train.stop_at_greedy_success=1.0", "--config.checkpoint.save_every_steps=10",
           "--config.metrics.progress_bar=False", timeout=1800)
    train_s = time.monotonic() - start
    records = read_metrics(workdir)
    seen = [r["rollout/success_rate_seen"] for r in records]
    greedy = [r["eval/greedy_success"] for r in records]
    final = greedy_success(workdir, str(tmp_path / "eval"))   # the saved checkpoint, by launch/eval.py
    print(json.dumps({"updates": len(records), "train_s": round(train_s, 1),
                      "learned_s_after_first_step": round(records[-1]["time"] - records[0]["time"], 1),
                      "greedy_success": greedy, "success_seen_first5": seen[:5],
                      "greedy": final["overall"]["success_rate"]}))
    assert len(records) < MAX_UPDATES and greedy[-1] == 1.0 and min(greedy[:-1] or [0.0]) < 1.0, greedy
    assert sum(v for v in seen[:5] if isinstance(v, float) and v == v) / 5 < 0.35, seen   # random: 1 in 8 wins
    episodes = final["overall"]["episodes"]
    assert episodes == len(toy.INSTRUCTIONS) and final["overall"]["success_rate"] == 1.0, final
