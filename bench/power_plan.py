r"""The browser regime's power calculation (issue 43), written before its runs: from last round's between-seed spreads
(docs/results/paper_regime/ablation*.json, 60-episode evals, 10 updates) and the JAX lab's effect sizes
(docs/results/lab/verdicts/table.json), the seeds an arm needs to resolve constT10 − grpo at 2 SE, and what N seeds
resolve, for success and for the mean steps of failures. Prints one JSON object (and writes --out).

    python3 bench/power_plan.py --out=docs/results/paper_regime/power/plan.json

Model (docs/learning.md, "The browser regime with power"): a seed's held-out success varies by training (variance
τ², the same at every eval size) plus the eval's binomial noise p(1 − p)/E for E episodes. τ² is last round's
pooled between-seed variance (both arms, traps off and on) less the binomial variance at E = 60; `grown`
scales it by the update count (a random walk: 30 updates, 3x the variance of 10). The arms' seeds are treated as
independent (they share the warm start and the eval draws, which pairing removes, but nothing after the first
update), so the difference of N seeds has SE = sqrt(2 · var / N). Steps of failures use the traps-on runs' pooled
SD as observed (the eval's share not removed: conservative). Resolving Δ at 2 SE needs N = (2 · sd_d / Δ)²; the
minimal detectable effect at 80% power is (t₀.₉₇₅,N−1 + z₀.₈) · SE, as the lab's (bench/lab_table.py).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os

import numpy as np
from lab_table import detectable

from jaxwebrl.env.tasks.chain.chain_tasks import SPLITS, goal_sequence
from jaxwebrl.seeds import EVAL_SEED_START

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")
ARMS = ("constT10", "grpo")


def seed_values(path: str, key: str) -> dict[str, list[float]]:
    """{arm: [per-seed value of `key`]} of an ablation JSON's constT10 and grpo arms."""
    with open(path, encoding="utf-8") as f:
        arms = json.load(f)["arms"]
    return {arm: [float(s[key]) for s in arms[arm]["seeds"] if s.get(key) is not None] for arm in ARMS}


def pooled_variance(groups: list[list[float]]) -> tuple[float, int]:
    """(pooled sample variance, its degrees of freedom) over groups of values."""
    dof = sum(len(g) - 1 for g in groups)
    return sum((len(g) - 1) * float(np.var(g, ddof=1)) for g in groups) / dof, dof


def seeds_needed(sd_d: float, effect: float) -> int:
    """Seeds an arm for a difference `effect` to sit 2 SE from 0: N = ceil((2 sd_d / effect)^2)."""
    return math.ceil((2 * sd_d / abs(effect)) ** 2)


def resolves(sd_d: float, seeds: int) -> dict:
    """What `seeds` seeds an arm resolve: the difference's SE, 2 SE, and the MDE at 80% power (two-sided 5%)."""
    se = sd_d / math.sqrt(seeds)
    return {"seeds": seeds, "se": se, "two_se": 2 * se, "mde80": detectable(se, seeds)}


def lab_effects(table: str, measure: str) -> dict[float, dict]:
    """{ratio: {"diff": constT10 − grpo, "grpo": grpo's value}} of the lab's verdict rows for `measure`."""
    with open(table, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    return {r["ratio"]: {"diff": r["mean"], "grpo": r["grpo"]} for r in rows
            if r["measure"] == measure and not isinstance(r["ratio"], str)}   # not P4's "4.0 vs 1.0" row


def budget(regime: str, updates: int, episodes: int, seeds: tuple[int, ...]) -> dict:
    """Wall seconds of one run (`updates` + a `episodes`-episode eval) at last round's medians (every record's
    train_s / steps and eval_s / episodes, nice 5 on this 2-core machine), and hours for N seeds x 2 arms."""
    per_update, per_episode = [], []
    for path in glob.glob(os.path.join(regime, "runs*", "*", "seed*.json")):
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        run = record["run"]
        per_update.append(run["train_s"] / record["steps"])
        per_episode.append(run["eval_s"] / run["eval"]["episodes"])
    s_update, s_episode = float(np.median(per_update)), float(np.median(per_episode))
    run_s = updates * s_update + episodes * s_episode
    return {"records": len(per_update), "s_per_update": s_update, "s_per_eval_episode": s_episode, "run_s": run_s,
            "hours": {str(n): 2 * n * run_s / 3600 for n in seeds}}


def eval_goals(instances: int) -> dict:
    """Distinct goals the eval plays: `instances` held-out seeds a chain split (under layout=fixed a page depends on
    the goal alone, so these are its distinct instances)."""
    per_split = {split: len({goal_sequence(presses, EVAL_SEED_START + i) for i in range(instances)})
                 for split, (presses, _) in SPLITS.items()}
    return {"episodes": instances * len(SPLITS), "distinct_goals": per_split, "total": sum(per_split.values())}


def plan(docs: str = DOCS, *, updates: int = 30, old_updates: int = 10, episodes: int = 300, old_episodes: int = 60,
         seeds: tuple[int, ...] = (6, 10, 25)) -> dict:
    regime = os.path.join(docs, "paper_regime")
    off, on = (seed_values(os.path.join(regime, name), "success") for name in ("ablation.json", "ablation_trap.json"))
    success = [v for arms in (off, on) for v in arms.values()]
    correlation = {name: float(np.corrcoef(arms["constT10"], arms["grpo"])[0, 1]) for name, arms in (("traps_off", off),
                                                                                                  ("traps_on", on))}
    var_seed, dof = pooled_variance([[100 * x for x in g] for g in success])
    rate = float(np.mean([x for g in success for x in g]))
    binomial = {e: 1e4 * rate * (1 - rate) / e for e in (old_episodes, episodes)}
    training = max(var_seed - binomial[old_episodes], 0.0)
    scenarios = {"as_at_10_updates": training, "grown": training * updates / old_updates}
    lab_success = lab_effects(os.path.join(docs, "lab", "verdicts", "table.json"), "success")
    targets = [*({"effect": "lab", "ratio": r, "points": e["diff"]} for r, e in sorted(lab_success.items())),
               {"effect": "paper", "points": 2.5}]   # points of success, constT10 - grpo
    out = {"inputs": {"success_rate": rate, "seed_variance_60": var_seed, "dof": dof,
                      "binomial_se": {str(e): math.sqrt(v) for e, v in binomial.items()}, "training_variance": training,
                      "seed_correlation": correlation},
           "eval": eval_goals(episodes // len(SPLITS)), "budget": budget(regime, updates, episodes, seeds), "success_targets": targets, "success": {}}
    for name, tau2 in scenarios.items():
        sd_d = math.sqrt(2 * (tau2 + binomial[episodes]))
        out["success"][name] = {"seed_sd": math.sqrt(tau2 + binomial[episodes]), "sd_diff": sd_d,
                                "seeds_needed": [{**t, "seeds": seeds_needed(sd_d, t["points"])} for t in targets],
                                "resolves": [resolves(sd_d, n) for n in seeds]}
    trap_steps = seed_values(os.path.join(regime, "ablation_trap.json"), "mean_steps_failure")
    var_steps, dof_steps = pooled_variance(list(trap_steps.values()))
    grpo_steps = float(np.mean(trap_steps["grpo"]))
    lab_steps = lab_effects(os.path.join(docs, "lab", "verdicts", "table.json"), "failure_steps")
    sd_d = math.sqrt(2 * var_steps)
    relative = {r: e["diff"] / e["grpo"] for r, e in sorted(lab_steps.items())}   # of grpo's failure length
    out["failure_steps"] = {
        "seed_sd": math.sqrt(var_steps), "dof": dof_steps, "grpo_traps_on": grpo_steps, "sd_diff": sd_d,
        "targets": [{"ratio": r, "relative": x, "steps": x * grpo_steps, "seeds": seeds_needed(sd_d, x * grpo_steps)}
                    for r, x in relative.items()],
        "resolves": [resolves(sd_d, n) for n in seeds]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    result = plan()
    args = parser.parse_args()
    result["command"] = "python3 bench/power_plan.py" + (f" --out={args.out}" if args.out else "")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
