"""The evaluation path and its report, driven by the scripted toy oracle (known answers), on real workers."""

import json

import pytest

from jaxwebrl.eval.evaluate import evaluate
from jaxwebrl.seeds import EVAL_SEED_START
from jaxwebrl.eval.report import markdown
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from tests.eval.trained import toy_config


def _config():
    config = toy_config()
    config.model.max_new_tokens = 64  # the scripted memory '{"steps_taken": 0}' is longer than the tiny policy's
    return config


def _oracle(epsilon):
    return lambda buffer: ScriptedBackend(toy_oracle_responder(epsilon), processor=tiny_processor(),
                                          fetch_image=buffer.screenshots.get, seed=0)


def test_perfect_oracle_scores_every_toy_task(tmp_path):
    report = evaluate(_config(), None, seeds=range(EVAL_SEED_START, EVAL_SEED_START + 8),
                      episodes_per_seed=2, num_workers=2, out_dir=str(tmp_path), make_handler=_oracle(0.0))
    assert set(report["tasks"]) == {"toy/A", "toy/B", "toy/C", "toy/D"}
    for task in report["tasks"].values():
        assert task["episodes"] == 4 and task["success_rate"] == 1.0 and task["steps_success"] == 3.0
        assert task["steps_failure"] is None and task["invalid_action_rate"] == 0.0
    assert report["splits"]["easy"]["episodes"] == 16 and report["overall"]["success_rate"] == 1.0
    assert report["overall"]["memory_chars"] > 0          # the oracle writes a memory each step
    with open(tmp_path / "eval.json") as f:
        assert json.load(f)["overall"]["episodes"] == 16
    table = (tmp_path / "eval.md").read_text()
    assert "| policy | 100.0% | 100.0% |" in table and "| toy/C | easy | 4 | 100.0% | 3.00 | – |" in table


def test_noisy_oracle_fails_some_and_counts_failures_separately(tmp_path):
    seeds = range(EVAL_SEED_START, EVAL_SEED_START + 8)
    report = evaluate(_config(), None, seeds=seeds, episodes_per_seed=2, num_workers=1,
                      make_handler=_oracle(1.0))                  # uniform over the two buttons: 1/8 succeed
    rows = report["episodes"]
    assert len(rows) == 16 and {r["seed"] for r in rows} == set(seeds)
    wins = [r for r in rows if r["reward"] > 0]
    assert report["overall"]["success_rate"] == pytest.approx(len(wins) / 16)
    assert len(wins) < 16 and report["overall"]["steps_failure"] == 3.0
    assert "| toy/A | easy | 4 |" in markdown(report)
