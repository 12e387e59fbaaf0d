"""Critic PPO learns the toy end to end: `--config=configs/ppo.py:toy` from the random tiny policy, through the real
policy server, rollout workers, ring buffer and trainer, with the value model trained next to the policy and saved
in the run's checkpoints, until the greedy policy reads the goal (tests/launch/test_toy_learns.py takes GRPO on to
all four instructions; this run's proof is the critic's, so it stops at the LoRA test's bar)."""

import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs.ppo import get_config
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.train import rl_config
from jaxwebrl.train.metrics import read_metrics
from jaxwebrl.train.update import make_optimizer
from tests.launch.test_toy_learns_lora import GOAL_READ
from tests.xla_flags import run_speed_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = "--config=configs/ppo.py:toy"
# A budget: the run stops once its greedy policy solves two of the four instructions, which a policy that does not
# read the goal cannot (tests/launch/test_toy_learns_lora.py's GOAL_READ says why). An update costs ~2x GRPO's (the
# critic's pass + its 4 epochs). To all four, earlier runs took 10 and 12 updates (shared 2-core box, load 12-17) and
# 330 s of the suite's two-worker pass; to two, 9 updates here (greedy 0.25 to 0.75 at the 9th, 145 s alone).
MAX_UPDATES = 24


@pytest.mark.slow
def test_critic_ppo_learns_to_read_the_toys_goal_from_scratch(tmp_path):
    workdir = str(tmp_path / "run")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(REPO, "launch", "train.py"), RECIPE, f"--workdir={workdir}",
                           f"--config.train.max_steps={MAX_UPDATES}", "--config.checkpoint.save_every_steps=10",
                           f"--config.train.stop_at_greedy_success={GOAL_READ}", "--config.metrics.progress_bar=False"],
                          cwd=REPO, env=run_speed_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    records = read_metrics(workdir)
    seen = [r["rollout/success_rate_seen"] for r in records]
    greedy = [r["eval/greedy_success"] for r in records]
    print(json.dumps({"updates": len(records), "train_s": round(time.monotonic() - start, 1), "greedy": greedy,
                      "success_seen": [round(v, 2) for v in seen],
                      "value_loss": [round(r["ppo_critic/value_loss"], 4) for r in records]}))
    assert greedy[-1] >= GOAL_READ and min(greedy[:-1] or [0.0]) < GOAL_READ, greedy
    assert sum(v for v in seen[:3] if v == v) / 3 < 0.5, seen        # it started from the random policy
    # the critic trained with it (every update logs its value loss) and sits in the last checkpoint
    assert all(np.isfinite(r["ppo_critic/value_loss"]) and r["ppo_critic/skipped_ratio"] == 0 for r in records)
    config = get_config("toy")
    policy = recipe_policy(config)
    critic = rl_config.value_model(config, policy)
    fresh = critic.init_state(policy.params)
    optimizer, _ = make_optimizer(rl_config.optimizer_settings(config))
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
    *_, meta, saved = checkpointer.restore(params=policy.params, opt_state=optimizer.init(policy.params),
                                           rng=jax.random.key(0), critic=fresh)
    checkpointer.close()
    assert meta["step"] == len(records)
    assert float(np.abs(np.asarray(saved.params["value_head"]["kernel"])).max()) > 0   # a trained value head
