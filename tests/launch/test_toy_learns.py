"""The quickest end-to-end proof that the loop learns: the GRPO recipe on the browser-free toy task, from the
random tiny policy, through the real policy server, rollout workers, ring buffer, versions and trainer, until
the greedy policy solves all four instructions (each needs the right press on all three turns)."""

import json
import os
import subprocess
import sys
import time

import pytest

from jaxwebrl.env import toy
from jaxwebrl.train.metrics import read_metrics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = "--config=configs/grpo.py:toy"
MAX_UPDATES = 40   # a budget, not the schedule: the run stops once it has learned (TARGET on two steps in a row)
TARGET = 0.95      # success of the episodes read since the previous update (rollout/success_rate_seen); earlier
                   # runs with a fixed 24 updates were still learning at the end in 2 of 7 (the asynchronous timing
                   # varies the path), so the run goes on until the policy has learned, or fails at MAX_UPDATES.
                   # Not 0.9 (one of three full-suite runs failed at 0.9; its log was lost): a policy that fails one
                   # instruction greedily succeeds ~0.875 at most on average, and two batches of ~36 episodes can
                   # read 0.9 by chance, so the greedy check after the stop would fail


def launch(script, *args, timeout):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", script), RECIPE, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
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
           f"--config.train.stop_at_success={TARGET}", "--config.checkpoint.save_every_steps=10",
           "--config.metrics.progress_bar=False", timeout=1800)
    train_s = time.monotonic() - start
    records = read_metrics(workdir)
    curve = [r["rollout/success_rate_seen"] for r in records]
    final = greedy_success(workdir, str(tmp_path / "eval"))
    print(json.dumps({"updates": len(curve), "train_s": round(train_s, 1),
                      "learned_s_after_first_step": round(records[-1]["time"] - records[0]["time"], 1),
                      "success_seen_first5": curve[:5], "success_seen_last5": curve[-5:],
                      "greedy": final["overall"]["success_rate"]}))
    assert len(curve) < MAX_UPDATES and min(curve[-2:]) >= TARGET, curve   # learned before the budget ran out
    assert sum(curve[:5]) / 5 < 0.35, curve              # random: 1 in 8 paths wins
    episodes = final["overall"]["episodes"]
    assert episodes == len(toy.INSTRUCTIONS) and final["overall"]["success_rate"] == 1.0, final
