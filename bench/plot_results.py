r"""The README's results figure from a learning run and an ablation: held-out success per stage and arm (left),
and the success of every episode the trainer read, per update, for each arm (right).

    python bench/plot_results.py --learning=/tmp/lr/learning_run.json --ablation=/tmp/lr/arms/ablation.json \
        --out=docs/results/learning.png

The learning run's RL stage (its recipe, e.g. constT10) is drawn as one more arm unless the ablation has it.
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learning", required=True, help="bench/learning_run.py JSON (initial and after_sft evals)")
    parser.add_argument("--ablation", required=True, help="bench/ablation.py JSON")
    parser.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args()
    with open(args.learning, encoding="utf-8") as f:
        learning = json.load(f)
    with open(args.ablation, encoding="utf-8") as f:
        ablation = json.load(f)

    names, values, errors = [], [], []
    for label, summary in (("initial", learning.get("initial")), ("SFT", learning.get("after_sft"))):
        if summary:
            names.append(label), values.append(summary["success"]), errors.append(_stderr(summary))
    arms = dict(ablation["arms"])
    recipe = os.path.splitext(os.path.basename(learning.get("config", "").split(":")[0]))[0]
    if learning.get("after_rl") and recipe and recipe not in arms:   # the learning run's RL stage is an arm too
        arms = {recipe: {"eval": learning["after_rl"], "curve": learning.get("rl_curve", [])}, **arms}
    for arm, result in arms.items():
        if result["eval"]:
            names.append(f"SFT + {arm}"), values.append(result["eval"]["success"]), errors.append(_stderr(result["eval"]))

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    baselines = len(names) - len(arms)   # initial / SFT bars in grey, arms in their curve colours
    colours = ["#aaaaaa", "#777777"][:baselines] + [f"C{i}" for i in range(len(names) - baselines)]
    left.bar(names, values, yerr=errors, capsize=4, color=colours)
    left.set_ylabel("held-out success")
    left.set_ylim(0, 1)
    left.set_title("held-out MiniWoB++ instances (±1 s.e.)")
    left.tick_params(axis="x", rotation=20)
    for arm, result in arms.items():
        points = [(p["step"], p["success_seen"]) for p in result["curve"] if p.get("success_seen") is not None]
        if points:
            right.plot(*zip(*points), marker="o", label=arm)
    right.set_xlabel(f"update (of {ablation['steps']})")
    right.set_ylabel("success of episodes read")
    right.set_ylim(0, 1)
    right.set_title("RL from the SFT warm start (sampled, temperature 1)")
    right.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(json.dumps({"out": args.out, "bars": dict(zip(names, values))}))


def _stderr(summary: dict) -> float:
    p, n = summary["success"], summary.get("episodes") or 1
    return (p * (1 - p) / n) ** 0.5


if __name__ == "__main__":
    main()
