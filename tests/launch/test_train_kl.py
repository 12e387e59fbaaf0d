"""launch/train.py end to end with KL to the reference policy in the reward (`--config.actor.kl_ctl=0.05`): the
toy trains, `ppo_actor/ref_kl` is in every metrics.jsonl record (0 at the first step, whose weights are the
reference's), and a resumed run keeps the run's reference (its recorded source), not its resumed weights."""

import json
import os

import pytest

from jaxwebrl.train.metrics import read_metrics
from tests.launch.test_train_run import SMALL, TOY, start


def train(workdir, max_steps):
    proc = start(workdir, *TOY, *SMALL, "--config.actor.kl_ctl=0.05", f"--config.train.max_steps={max_steps}",
                 "--config.train.lr=1e-3")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return read_metrics(workdir)


@pytest.mark.slow
def test_kl_in_the_reward_trains_the_toy_and_a_resume_keeps_the_reference(tmp_path):
    workdir = str(tmp_path / "run")
    records = train(workdir, 2)
    assert [r["step"] for r in records] == [1, 2]
    kl = [r["ppo_actor/ref_kl"] for r in records]
    assert kl[0] == 0.0 and kl[1] > 0.0, kl
    with open(os.path.join(workdir, "reference.json")) as f:
        assert json.load(f) == {"source": "recipe", "step": None}

    records = train(workdir, 3)   # resumes from step 2; the reference stays the recipe's weights
    assert [r["step"] for r in records] == [1, 2, 3]
    assert records[-1]["ppo_actor/ref_kl"] > 0.0
