r"""docs/learning.md's results figure from a learning run and an ablation: held-out success per stage and arm (left: the
mean over seeds ± 1 SE over seeds, each seed a dot; a single eval gets its binomial SE), and the success of every
episode the trainer read, per update, one line per seed of each arm (right).

    python bench/plot_results.py --learning=/tmp/lr/learning_run.json --ablation=/tmp/lr/arms/ablation.json \
        --out=docs/results/learning.png
    python bench/plot_results.py --learning=/tmp/lr/learning_run.json --out=/tmp/lr/learning.png   # no ablation

The learning run's RL stage (its recipe, e.g. constT10) is drawn as one more arm unless the ablation has it.
Reads both the multi-seed JSONs (`rl_seeds`, arms' `runs`) and the single-run ones written before them.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from learning_run import recipe_name  # noqa: E402
from seed_stats import binomial_se, mean_se  # noqa: E402


def learning_runs(learning: dict) -> list[dict]:
    """[{"eval", "curve"}] of the learning run's RL seeds (one for a single-run JSON; none without an RL eval)."""
    if "rl_seeds" in learning:
        return [{"eval": r["after_rl"], "curve": r["rl_curve"]} for r in learning["rl_seeds"] if r["after_rl"]]
    if learning.get("after_rl"):
        return [{"eval": learning["after_rl"], "curve": learning.get("rl_curve", [])}]
    return []


def ablation_runs(arm: dict) -> list[dict]:
    """[{"eval", "curve"}] of one ablation arm's seeds (its `runs`, or the single run of an older JSON)."""
    runs = arm["runs"] if "runs" in arm else [arm]
    return [{"eval": r["eval"], "curve": r.get("curve", [])} for r in runs if r.get("eval")]


def bar(evals: list[dict]) -> dict:
    """{"mean", "se", "seeds"}: the mean success over seeds ± SE over seeds; one eval: its binomial SE (a pooled
    eval, bench/seed_stats.py `pool_evals`: over all its episodes, its evals as the dots)."""
    rates = [e["success"] for e in evals]
    mean, se = mean_se(rates)
    if len(rates) == 1:
        se = binomial_se(rates[0], evals[0].get("episodes"))
        rates = evals[0].get("success_each") or rates
    return {"mean": mean, "se": se, "seeds": rates}


def plot(learning: dict, ablation: dict | None, out: str) -> dict:
    """Write the figure to `out` (PNG); returns {bar name: bar(...)}."""
    bars: dict[str, dict] = {}
    sft = (ablation or {}).get("after_sft") or learning.get("after_sft")   # the ablation's may pool several evals
    for label, summary in (("initial", learning.get("initial")), ("SFT", sft)):
        if summary:
            bars[label] = bar([summary])
    baselines = len(bars)
    arms = {name: ablation_runs(arm) for name, arm in (ablation or {}).get("arms", {}).items()}
    recipe = recipe_name(learning.get("config", ""))
    if recipe and recipe not in arms and learning_runs(learning):   # the learning run's RL stage is an arm too
        arms = {recipe: learning_runs(learning), **arms}
    arms = {name: runs for name, runs in arms.items() if runs}
    for name, runs in arms.items():
        bars[f"SFT + {name}"] = bar([r["eval"] for r in runs])

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(bars)
    colours = ["#aaaaaa", "#777777"][:baselines] + [f"C{i}" for i in range(len(arms))]
    x = np.arange(len(names))
    left.bar(x, [bars[n]["mean"] for n in names], yerr=[bars[n]["se"] or 0.0 for n in names], capsize=4,
             color=colours, alpha=0.85)
    rng = np.random.default_rng(0)   # a fixed jitter so seeds with equal success stay visible
    for i, name in enumerate(names):
        seeds = bars[name]["seeds"]
        if len(seeds) > 1:
            left.scatter(i + rng.uniform(-0.15, 0.15, len(seeds)), seeds, s=14, color="black", zorder=3)
    left.set_xticks(x, names, rotation=20)
    left.set_ylabel("held-out success")
    left.set_ylim(0, 1)
    counts = sorted({len(bars[f"SFT + {n}"]["seeds"]) for n in arms} - {1})
    title = (f"held-out: mean ± 1 s.e. over {'/'.join(map(str, counts))} seeds (dots)" if counts
             else "held-out instances (±1 binomial s.e.)")
    if sft and sft.get("evals", 1) > 1:
        title += f"; SFT: {sft['evals']} evals pooled"
    left.set_title(title, fontsize=10)
    for i, (name, runs) in enumerate(arms.items()):
        for j, run in enumerate(runs):
            points = [(p["step"], p["success_seen"]) for p in run["curve"] if p.get("success_seen") is not None]
            if points:
                right.plot(*zip(*points), marker="o", markersize=3, color=f"C{i}", alpha=0.6,
                           label=name if j == 0 else None)
    right.set_xlabel(f"update (of {ablation['steps']})" if ablation and "steps" in ablation else "update")
    right.set_ylabel("success of episodes read")
    right.set_ylim(0, 1)
    right.set_title("RL from SFT (sampled, T = 1; a line per seed)")
    if arms:
        right.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return bars


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learning", required=True, help="bench/learning_run.py JSON (initial and after_sft evals)")
    parser.add_argument("--ablation", default=None, help="bench/ablation.py JSON (optional)")
    parser.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args()
    with open(args.learning, encoding="utf-8") as f:
        learning = json.load(f)
    ablation = None
    if args.ablation:
        with open(args.ablation, encoding="utf-8") as f:
            ablation = json.load(f)
    print(json.dumps({"out": args.out, "bars": plot(learning, ablation, args.out)}))


if __name__ == "__main__":
    main()
