"""bench/plot_results.py on small synthetic JSONs (the multi-seed layout and the single-run one before it)."""

import json
import math
import os
import subprocess
import sys

import matplotlib.image
import pytest
from plot_results import plot

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


def _eval(success, episodes=40):
    return {"success": success, "episodes": episodes, "tasks": {"t": success}, "task_episodes": {"t": episodes}}


def _curve(*seen):
    return [{"step": i + 1, "success": 0.5, "success_seen": s} for i, s in enumerate(seen)]


LEARNING = {"config": "configs/constT10.py", "initial": _eval(0.1), "after_sft": _eval(0.5),
            "rl_seeds": [{"seed": s, "after_rl": _eval(r), "rl_curve": _curve(0.5, r)}
                         for s, r in enumerate([0.6, 0.5, 0.7])]}
ABLATION = {"steps": 2, "arms": {
    "grpo": {"runs": [{"seed": 0, "eval": _eval(0.4), "curve": _curve(0.5, 0.4)},
                      {"seed": 1, "eval": _eval(0.6), "curve": _curve(0.5, 0.6)}]},
    "raftpp": {"eval": _eval(0.75, 100), "curve": _curve(0.5, 0.7)},          # a single-run (older) arm
}}


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bars_are_mean_and_se_over_seeds_and_the_png_is_written(tmp_path):
    out = str(tmp_path / "fig.png")
    bars = plot(LEARNING, ABLATION, out)
    assert list(bars) == ["initial", "SFT", "SFT + constT10", "SFT + grpo", "SFT + raftpp"]
    assert bars["SFT"]["se"] == pytest.approx(math.sqrt(0.25 / 40)) and bars["SFT"]["seeds"] == [0.5]
    assert bars["SFT + constT10"]["mean"] == pytest.approx(0.6)
    assert bars["SFT + constT10"]["se"] == pytest.approx(0.1 / math.sqrt(3))   # sample std 0.1 over 3 seeds
    assert bars["SFT + grpo"]["seeds"] == [0.4, 0.6] and bars["SFT + grpo"]["se"] == pytest.approx(0.1)
    assert bars["SFT + raftpp"]["se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 100))   # one eval: binomial
    assert _is_png(out) and matplotlib.image.imread(out).shape[1] > 800


def test_the_cli_plots_a_learning_run_alone(tmp_path):
    learning = tmp_path / "learning_run.json"
    learning.write_text(json.dumps(LEARNING))
    out = tmp_path / "fig.png"
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "plot_results.py"), f"--learning={learning}",
                           f"--out={out}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = json.loads(proc.stdout)
    assert list(printed["bars"]) == ["initial", "SFT", "SFT + constT10"] and _is_png(out)


def test_the_ablations_pooled_sft_eval_is_the_sft_bar(tmp_path):
    pooled = dict(_eval(0.55, 480), evals=4, success_each=[0.5, 0.55, 0.6, 0.55])
    bars = plot(LEARNING, dict(ABLATION, after_sft=pooled), str(tmp_path / "fig.png"))
    assert bars["SFT"]["mean"] == pytest.approx(0.55) and bars["SFT"]["seeds"] == [0.5, 0.55, 0.6, 0.55]
    assert bars["SFT"]["se"] == pytest.approx(math.sqrt(0.55 * 0.45 / 480))   # over all 480 episodes


def _seed(seed, easy, hard, fail_steps, memory):
    return {"seed": seed, "success": (easy + hard) / 2, "success_by_split": {"easy": easy, "hard": hard},
            "mean_steps_success": 4.0, "mean_steps_failure": fail_steps, "memory_chars_curve": memory}


def test_the_paper_regime_figure_plots_each_split_and_each_outcome_length(tmp_path):
    from plot_paper_regime import plot as plot_regime

    ablation = {"steps": 2, "arms": {"constT10": {"seeds": [_seed(0, 0.8, 0.2, 25.0, [13.0, 14.0]),
                                                            _seed(1, 0.6, 0.4, 27.0, [13.0, 12.0])]},
                                     "grpo": {"seeds": [_seed(0, 0.7, 0.1, 20.0, [13.0, 20.0])]}}}
    trap = {"steps": 2, "arms": {"constT10": {"seeds": [_seed(0, 0.5, 0.1, 6.0, [13.0])]}}}
    out = str(tmp_path / "regime.png")
    numbers = plot_regime(ablation, trap, out)
    assert _is_png(out)
    easy = numbers["success_by_split"]["constT10"]["easy"]
    assert easy["mean"] == pytest.approx(0.7) and easy["se"] == pytest.approx(0.1) and easy["seeds"] == [0.8, 0.6]
    assert numbers["lengths"]["traps off"]["constT10"]["failure"] == pytest.approx((26.0, 1.0))
    assert numbers["lengths"]["traps on"]["constT10"]["failure"][0] == 6.0
    assert "medium" not in numbers["success_by_split"]["grpo"]   # a split no seed played is not drawn
