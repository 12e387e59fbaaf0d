"""launch/sft.py: oracle demonstrations on training seeds -> SFT -> a params checkpoint that an RL run starts from
(step 0, fresh optimizer, the SFT weights) via config.model.init_params, and that launch/eval.py can evaluate."""

import json
import os
import subprocess
import sys

import jax
import numpy as np

from configs.constT10 import get_config
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.checkpoint.policies import initial_policy, load_policy, recipe_policy
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.train.config_validation import validate
from jaxwebrl.train.trainer import Trainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(script, *args):
    cmd = [sys.executable, os.path.join(REPO, "launch", script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)


class Sink:
    def __init__(self):
        self.published = []

    def set_weights(self, params, version):
        self.published.append((params, version))


def leaves_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_sft_warm_start_is_where_the_rl_run_starts(tmp_path):
    sft_dir = tmp_path / "sft"
    proc = launch("sft.py", "--config=configs/constT10.py:toy", f"--workdir={sft_dir}", "--steps=4",
                  "--num_seeds=4", "--batch_size=4", "--lr=1e-2", "--log_every=0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["won_episodes"] == {"toy": 4} and summary["demo_steps"] == 12 and summary["seeds"] == [0, 3]
    record = json.load(open(sft_dir / "sft.json"))
    assert len(record["losses"]) == 4 and np.isfinite(record["losses"]).all()

    config = get_config("toy")
    config.model.init_params = str(sft_dir)
    validate(config, str(tmp_path / "rl"))
    warm, info = load_policy(get_config("toy"), str(sft_dir))         # what launch/eval.py --policy=DIR runs
    assert info["step"] == 4 and info["source"] == str(sft_dir)
    initial = tiny_policy(seed=config.seed)
    assert leaves_equal(initial_policy(config).params, warm.params)   # what a fresh run of this config starts from
    assert not leaves_equal(warm.params, initial.params)
    policy = recipe_policy(config)            # what the supervisor hands the trainer; it starts from the warm start
    assert leaves_equal(policy.params, initial.params)

    buffer = RingBuffer.create(str(tmp_path / "rl" / "buffer"), capacity_steps=64, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    sink = Sink()
    trainer = Trainer(config, str(tmp_path / "rl"), policy=policy, buffer=buffer, weight_sink=sink)
    try:
        assert trainer.state.step == 0 and trainer.state.version == 0      # checkpoint/resume.py, step 3
        assert leaves_equal(trainer.state.params, warm.params)
        assert leaves_equal(sink.published[0][0], warm.params) and sink.published[0][1] == 0
        fresh = trainer.optimizer.init(warm.params)                   # fresh optimizer state: zero moments
        assert leaves_equal(trainer.state.opt_state, fresh)
    finally:
        trainer.close()


def test_bad_seed_range_and_missing_warm_start_fail_in_one_line(tmp_path):
    proc = launch("sft.py", "--config=configs/constT10.py:toy", f"--workdir={tmp_path / 'a'}",
                  "--seed_start=999990", "--num_seeds=20")
    assert proc.returncode == 1 and "held out" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("sft error: training seeds 999990..1000009")
    proc = launch("train.py", "--config=configs/constT10.py:toy", f"--workdir={tmp_path / 'b'}",
                  f"--config.model.init_params={tmp_path}")
    assert proc.returncode == 1
    assert f"model.init_params='{tmp_path}'" in proc.stderr.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "b" / "checkpoints")
