r"""The paper-regime figure (issue 26) from bench/ablation.py's JSONs, traps off and traps on: held-out success
per difficulty split and arm (mean ± 1 SE over seeds, each seed a dot), mean steps of failed and of successful
episodes per arm (traps off: failures run long; traps on: they stop early), and the memory the agent holds per
step over training, one line per seed.

    python bench/plot_paper_regime.py --ablation=docs/results/paper_regime/ablation.json \
        --trap=docs/results/paper_regime/ablation_trap.json --out=docs/results/paper_regime/paper_regime.png

Prints one JSON object: the plotted means and SEs.
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from seed_stats import mean_se  # noqa: E402

SPLITS = ("easy", "medium", "hard")


PLURAL = {"failure": "failures", "success": "successes"}

def split_bars(ablation: dict) -> dict:
    """{arm: {split: {"mean", "se", "seeds"}}}: held-out success per difficulty split over the arm's seeds."""
    out = {}
    for arm, record in ablation["arms"].items():
        out[arm] = {}
        for split in SPLITS:
            rates = [s["success_by_split"][split] for s in record.get("seeds", [])
                     if s["success_by_split"].get(split) is not None]
            if rates:
                mean, se = mean_se(rates)
                out[arm][split] = {"mean": mean, "se": se, "seeds": rates}
    return out


def length_bars(ablation: dict) -> dict:
    """{arm: {"failure": (mean, se), "success": (mean, se)}}: mean episode steps by outcome over seeds."""
    out = {}
    for arm, record in ablation["arms"].items():
        seeds = record.get("seeds", [])
        out[arm] = {kind: mean_se([s[f"mean_steps_{kind}"] for s in seeds if s.get(f"mean_steps_{kind}")])
                    for kind in ("failure", "success")}
    return out


def plot(ablation: dict, trap: dict | None, out: str) -> dict:
    """Write the figure to `out` (PNG); returns the plotted numbers."""
    bars = split_bars(ablation)
    arms = list(bars)
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.8 / max(1, len(arms))
    rng = np.random.default_rng(0)
    for i, arm in enumerate(arms):
        xs = [j + (i - (len(arms) - 1) / 2) * width for j, s in enumerate(SPLITS) if s in bars[arm]]
        values = [bars[arm][s] for s in SPLITS if s in bars[arm]]
        left.bar(xs, [v["mean"] for v in values], width=width, yerr=[v["se"] or 0.0 for v in values], capsize=3,
                 color=f"C{i}", alpha=0.85, label=arm)
        for x, v in zip(xs, values):
            left.scatter(x + rng.uniform(-width / 4, width / 4, len(v["seeds"])), v["seeds"], s=10, color="black",
                         zorder=3)
    left.set_xticks(range(len(SPLITS)), SPLITS)
    left.set_ylim(0, 1)
    left.set_ylabel("held-out success")
    left.set_title("traps off: mean ± 1 s.e. over seeds (dots)", fontsize=10)
    left.legend(fontsize=8)

    lengths = {"traps off": length_bars(ablation)}
    if trap:
        lengths["traps on"] = length_bars(trap)
    groups = [(regime, kind) for regime in lengths for kind in ("failure", "success")]
    for i, arm in enumerate(arms):
        xs = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(groups))]
        cells = [lengths[regime].get(arm, {}).get(kind, (None, None)) for regime, kind in groups]
        middle.bar(xs, [c[0] or 0.0 for c in cells], width=width, yerr=[c[1] or 0.0 for c in cells], capsize=3,
                   color=f"C{i}", alpha=0.85, label=arm)
    middle.set_xticks(range(len(groups)), [f"{regime}\n{PLURAL[kind]}" for regime, kind in groups], fontsize=8)
    middle.set_ylabel("mean steps of an episode")
    middle.set_title("episode length by outcome", fontsize=10)

    for i, arm in enumerate(arms):
        for j, seed in enumerate(ablation["arms"][arm].get("seeds", [])):
            points = [(k + 1, m) for k, m in enumerate(seed.get("memory_chars_curve") or []) if m is not None]
            if points:
                right.plot(*zip(*points), color=f"C{i}", alpha=0.6, label=arm if j == 0 else None)
    right.set_xlabel(f"update (of {ablation.get('steps')})")
    right.set_ylabel("memory characters a step")
    right.set_title("memory over training (traps off, a line per seed)", fontsize=10)
    if arms:
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return {"success_by_split": bars, "lengths": lengths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ablation", required=True, help="bench/ablation.py JSON, traps off")
    parser.add_argument("--trap", default=None, help="its traps-on twin (optional)")
    parser.add_argument("--out", required=True, help="PNG path")
    args = parser.parse_args()
    with open(args.ablation, encoding="utf-8") as f:
        ablation = json.load(f)
    trap = None
    if args.trap:
        with open(args.trap, encoding="utf-8") as f:
            trap = json.load(f)
    print(json.dumps({"out": args.out, **plot(ablation, trap, args.out)}))


if __name__ == "__main__":
    main()
