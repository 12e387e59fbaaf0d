"""launch/eval.py's path with the real policy server and sampler: the tiny policy on the toy env and on one
MiniWoB++ task in real headless Chromium, initial and trained-checkpoint policies."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

from jaxwebrl.buffer.from_config import create_sized
from jaxwebrl.env.registry import env_specs
from jaxwebrl.eval.evaluate import evaluate, play
from jaxwebrl.eval.probe import SuccessProbe
from jaxwebrl.eval.report import task_label
from jaxwebrl.seeds import EVAL_SEED_START
from jaxwebrl.checkpoint.policies import initial_policy, load_policy
from tests.eval.trained import toy_config, write_trained_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_trained_checkpoint_on_toy_through_policy_server(tmp_path):
    config, _ = write_trained_checkpoint(str(tmp_path / "run"))
    policy, info = load_policy(config, str(tmp_path / "run"))
    report = evaluate(config, policy, seeds=range(EVAL_SEED_START, EVAL_SEED_START + 4), episodes_per_seed=2,
                      num_workers=2, temperature=0.0, policy_info=info, out_dir=str(tmp_path / "eval"))
    assert set(report["tasks"]) == {"toy/A", "toy/B", "toy/C", "toy/D"}
    assert report["overall"]["episodes"] == 8 and report["overall"]["env_failed"] == 0
    assert report["policy"]["policy_version"] == 7 and report["setup"]["temperature"] == 0.0
    for row in report["episodes"]:
        assert row["steps"] == 3                      # the toy always plays its three turns
    # greedy decoding of one policy on one instance is deterministic: both episodes of a seed agree
    by_seed = {}
    for row in report["episodes"]:
        by_seed.setdefault(row["seed"], set()).add(row["reward"])
    assert all(len(rewards) == 1 for rewards in by_seed.values())
    assert (tmp_path / "eval" / "eval.md").read_text().startswith("| Policy | Easy | Avg |")


def test_a_sampled_eval_replays_the_same_episodes_whatever_the_batching(tmp_path):
    """Evaluation seeds every step (`WorkerConfig.step_seeds`): at temperature 1, one worker (batches of one) and
    three workers (batches of several, in another order) play exactly the same tokens on every instance, and the
    two episodes of an instance (slots 0 and 1) still draw differently."""
    config = toy_config()
    policy = initial_policy(config)
    jobs = [(task, seed) for task in env_specs(config.env.tasks) for seed in (EVAL_SEED_START, EVAL_SEED_START + 1)]

    def responses(num_workers: int) -> dict:
        buffer = create_sized(config, str(tmp_path / f"buffer{num_workers}"), len(jobs) * 2)
        by_instance: dict = {}
        for episode in play(config, policy, jobs, buffer, episodes_per_seed=2, num_workers=num_workers,
                            temperature=None):
            steps = [step.input_ids.tolist() for step in episode.steps]
            by_instance.setdefault((task_label(episode), episode.info["instance_seed"]), []).append(steps)
        return by_instance

    alone, batched = responses(1), responses(3)
    assert config.model.temperature == 1.0 and len(alone) == len(jobs)
    assert batched == alone
    assert any(slots[0] != slots[1] for slots in alone.values())


def test_launch_eval_initial_policy_on_miniwob_in_chromium(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, str(REPO / "launch" / "eval.py"), "--config=configs/constT10.py", "--policy=initial",
         "--tasks=miniwob/click-test", "--num_seeds=2", "--num_workers=2", f"--out_dir={tmp_path}",
         "--config.env.max_episode_steps=2"],
        capture_output=True, text=True, env=env, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    task = report["tasks"]["miniwob/click-test"]
    assert task["split"] == "easy" and task["episodes"] == 2 and task["env_failed"] == 0
    steps = [r["steps"] for r in report["episodes"]]
    assert all(1 <= s <= 2 for s in steps)
    rate = task["invalid_action_rate"]
    assert rate is not None and 0.0 <= rate <= 1.0
    assert np.isfinite(report["overall"]["memory_chars"])
    assert "| miniwob/click-test | easy | 2 |" in out.stdout
    viewer = (tmp_path / "eval" / "index.html").read_text()     # the trajectory viewer, screenshots beside it
    assert viewer.count('class="step"') == sum(steps) and len(list((tmp_path / "eval" / "shots").glob("*.png"))) > 0
    assert f"trajectory viewer: file://{tmp_path}/eval/index.html" in out.stdout


def test_success_probe_agrees_with_greedy_evaluation_and_compiles_once(tmp_path):
    """The training run's greedy check (train.stop_at_greedy_success) measures what launch/eval.py measures at
    temperature 0, for each params it is given, and its policy server compiles for the first call only."""
    config, trained = write_trained_checkpoint(str(tmp_path / "run"))
    initial = initial_policy(config)
    seeds = range(EVAL_SEED_START, EVAL_SEED_START + 4)
    probe = SuccessProbe(config, initial, num_seeds=4)
    try:
        checks, traces = [], []
        for params, version in ((initial.params, 0), (trained, 7), (initial.params, 0)):
            expected = evaluate(config, initial.replace_params(params), seeds=seeds, temperature=0.0)
            checks.append((probe(params, version), expected["overall"]["success_rate"]))
            traces.append(sum(probe.players.service.server._sampler.trace_counts.values()))
    finally:
        probe.close()
    assert all(got == want for got, want in checks), checks
    assert traces[0] > 0 and traces[1] == traces[2] == traces[0], traces
