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
UPDATES = 32   # sampled success passed 0.9 near update 18 in most runs, but 2 of 7 runs with 24 updates were still
              # learning at the end (0.46 and 0.92 sampled success): the asynchronous timing varies the path; later
              # updates are slower (the groups turn uniform, dynamic sampling reads more episodes to fill a batch)


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
    launch("train.py", f"--workdir={workdir}", f"--config.train.max_steps={UPDATES}",
           "--config.checkpoint.save_every_steps=10", "--config.metrics.progress_bar=False", timeout=1800)
    train_s = time.monotonic() - start
    curve = [r["rollout/success_rate_seen"] for r in read_metrics(workdir)]
    final = greedy_success(workdir, str(tmp_path / "eval"))
    print(json.dumps({"updates": len(curve), "train_s": round(train_s, 1), "success_seen_first5": curve[:5],
                      "success_seen_last5": curve[-5:], "greedy": final["overall"]["success_rate"]}))
    assert len(curve) == UPDATES
    assert sum(curve[:5]) / 5 < 0.35, curve              # random: 1 in 8 paths wins
    assert sum(curve[-5:]) / 5 > 0.8, curve
    episodes = final["overall"]["episodes"]
    assert episodes == len(toy.INSTRUCTIONS) and final["overall"]["success_rate"] == 1.0, final
