"""The toy learning run of tests/launch/test_toy_learns.py with LoRA: rank-8 adapters on every decoder projection
of the random tiny policy, its base frozen in bf16. A file of its own so that the two-worker suite (`--dist
loadfile`) can run it beside the full-weight run instead of after it."""

import json
import time

import pytest

from jaxwebrl.train.metrics import read_metrics
from tests.launch.test_toy_learns import greedy_success, launch

# The adapters' lr, ~3x the full-weight run's 3e-4: AdamW moves every adapter entry by ~lr a step, and the merged
# weight W + (alpha/rank) B A along the adapters' rank-8 directions. At 3e-3 one run of four (and one CI run) did not
# learn; at 1e-3, 8 runs of 8 (2 December) did.
LORA_LR = 1e-3
LORA = ("--config.model.lora.rank=8", f"--config.train.lr={LORA_LR}")
# What the test asks: the greedy policy solves two of the four instructions. That is learning to read the goal: the
# four paths differ in their first two presses, so a policy that does not read the goal presses one fixed sequence
# (each press a function of the presses before it) and solves at most one (greedy 0.25). Not all four: on its frozen
# random base the adapters first learn the goal's first word only (greedy 0.5), and leaving that plateau is a matter of
# luck, not of the code (neither lr 5e-4, 2e-3 nor rank 16 removed it): on 5 December 18 of 20 runs left it within 9-20
# updates; on 6 December CI's three seeds (0, 1, 2) reached 0.5 at updates 2, 6 and 9 and none had left it by its 24th.
# Run here side by side on seeds 1, 3, 4 and 5 (24 updates each, beside the niced browser study), 3a2a676 solved all
# four in 1 run of 4 and e070f80 (the 5 December code) in 2 of 4; two runs fell back from 0.75 or 0.5 to 0 (behaviour
# KL up to 0.76 an update). Each of these 11 runs, and the test's own seed 0 here (0.75 at update 9), had reached 0.5
# or more by its 10th update (docs/results/house/lora_toy_plateau.json). A LoRA path that cannot learn (adapters never
# served, never trained, their gradient's sign flipped) stays at its base's greedy success and fails (checked: with
# `lora._merged`'s delta zeroed, greedy sat at 0.25 and 0 over 16 updates of seeds 0 and 1, a 359-s failure); a run
# that has not reached 0.5 within LORA_UPDATES is followed by one on the next seed.
GOAL_READ = 0.5
LORA_UPDATES = 16
SEEDS = (0, 1)


def lora_run(workdir: str, seed: int) -> list[dict]:
    """The metrics records of a LoRA toy run of `seed` that stops once the greedy policy solves two of four."""
    launch("train.py", f"--workdir={workdir}", f"--config.train.max_steps={LORA_UPDATES}", *LORA,
           f"--config.seed={seed}", f"--config.train.stop_at_greedy_success={GOAL_READ}",
           "--config.checkpoint.save_every_steps=10", "--config.metrics.progress_bar=False", timeout=1800)
    return read_metrics(workdir)


@pytest.mark.slow
def test_grpo_learns_the_toy_with_lora_adapters_on_a_frozen_base(tmp_path):
    """The server decodes the merged weights of each version (the frozen base is tests/train/test_lora.py's), and
    the greedy policy comes to read the goal, and so does launch/eval.py's from the LoRA checkpoint (base +
    adapters)."""
    runs = []
    for seed in SEEDS:
        workdir = str(tmp_path / f"run{seed}")
        start = time.monotonic()
        records = lora_run(workdir, seed)
        greedy = [r["eval/greedy_success"] for r in records]
        runs.append({"seed": seed, "updates": len(records), "train_s": round(time.monotonic() - start, 1),
                     "greedy": greedy, "success_seen": [round(r["rollout/success_rate_seen"], 2) for r in records]})
        print(json.dumps(runs[-1]))
        if greedy[-1] >= GOAL_READ:
            break
    assert greedy[-1] >= GOAL_READ and min(greedy[:-1] or [0.0]) < GOAL_READ, runs
    final = greedy_success(workdir, str(tmp_path / "eval"))
    assert final["overall"]["success_rate"] >= GOAL_READ, (final, runs)
