r"""The paper's ablation at CPU scale: constT10 (1/k) vs grpo (1/|τ|) vs raftpp (success-filtered cloning), each
trained for the same number of updates from the same SFT warm start, on the same tasks, then evaluated on the
same held-out instances. Prints one JSON object (and writes OUT/ablation.json).

    python bench/learning_run.py --out=/tmp/lr --stages=sft                       # the shared warm start
    python bench/ablation.py --sft=/tmp/lr/sft --out=/tmp/ablation --steps=12     # three arms, then eval each
    python bench/ablation.py --sft=/tmp/lr/sft --out=/tmp/ablation --steps=15 --eval_seeds=40 --seeds=5
    python bench/ablation.py ... --resume --sft_eval=DIR   # the finished runs again, against another SFT eval
    python bench/ablation.py ... --resume --record=docs/results/paper_regime/runs   # resumable across machines

The paper's regime (issue 26; `--variant=long`: chain tasks with 10/20/30-step horizons and free memory,
configs/base.py `long`), traps off and on, into docs/learning.md's evidence:

    python bench/learning_run.py --config=configs/constT10.py:long --out=R --stages=sft,eval_sft
    python bench/ablation.py --variant=long --sft=R/sft --out=R/arms --steps=S --seeds=5 --resume \
        --json=docs/results/paper_regime/ablation.json
    python bench/ablation.py --variant=long --sft=R/sft --out=R/arms_trap --steps=S --seeds=3 --resume \
        --json=docs/results/paper_regime/ablation_trap.json -- \
        "--config.env.tasks=chain/easy-cue?layout=fixed&trap=2,chain/medium-cue?layout=fixed&trap=2,chain/hard-cue?layout=fixed&trap=2"

Per seed (`arms[recipe].seeds`): held-out success overall and per difficulty split, mean steps of successes and
failures and their ratio, the share of failures that ran to the horizon, memory characters a step (by outcome),
keys and generic share, clipped fraction, seconds an update, memory over training; `split_differences`: each
split's arm differences ± SE; `horizons`: each task's own horizon.

Seeds: --seeds=N > 1 trains every arm N times from the same warm start with --config.seed=s, s in 0..N-1
(OUT/<recipe>/rl_seed<s>, eval in OUT/<recipe>/eval_seed<s>); --seeds=1 keeps OUT/<recipe>/{rl,eval} and the
recipe's own seed. Each arm gets the learning run's `summary` (bench/seed_stats.py) against the SFT eval of
--sft_eval (default: eval_sft next to --sft, as bench/learning_run.py lays it out; it must have played the same
held-out instances; several comma-separated evals of it with other sampling seeds are pooled, which shrinks the
error every seed's difference shares), and `arm_differences` holds every pair's difference of mean success ± SE.
--learning=OUT/learning_run.json adds that run's RL seeds as one more arm (its recipe, e.g. constT10 trained by
bench/learning_run.py --seeds=N), when it trained the same number of updates on the same held-out instances.

Records (--record=DIR): every finished run is also written to DIR/<recipe>/seed<s>.json (its curve, eval
summary, dynamics and wall times, with the warm start's params digest, the steps, variant, overrides, held-out
instances and commit). With --resume, a run that OUT does not hold is taken from its record when all of those but
the commit match, and trained again (with a line saying why) when they do not: a fresh machine with the same warm
start (a deterministic SFT regenerates it bit for bit; the digest checks that it did) picks up where the last one
stopped, and the records are small enough to commit. A run being trained keeps its newest checkpoint beside its
future record (DIR/<recipe>/seed<s>.unfinished/, bench/run_records.py), and with --resume a fresh machine goes on
from that copy (commit it to carry a run across machines). A record inside the checkout is refused (before any run,
and at every save) while jaxwebrl/ or bench/ have uncommitted changes. Every start of a run's training is kept in
its workdir (`starts.json`: commit, updates already done); a start on a workdir that holds updates, or on a copy,
continues from its checkpoint, and the run's `resumed` (in its record and per seed) counts those starts.

`paired_differences`: per pair of arms, d_s = a_s − b_s paired by seed number (every arm's seed s starts from the
one warm start and plays the same eval instances with the same sampling seeds) for success, steps of failures,
memory and clip rate, with the 95% t-interval and MDE, and for constT10 − grpo the verdict of docs/learning.md's
predictions B1-B5 (the browser regime with power).

Per arm: held-out success, mean steps of successful and of failed episodes (does 1/k shorten failures, as the
paper found?), memory size, and the training curve. The budget is a number of updates, not wall clock, so the
arms stay comparable when the machine's load changes; each arm's wall time is reported too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import subprocess

from jaxwebrl.env.registry import check_env_spec, env_specs, task_horizon
from jaxwebrl.plan.validation import apply_overrides

from lab_table import interval, signed, verdict
from learning_run import (ROOT, check_instances, check_seeds, curve, eval_cmd, eval_summary, recipe_name, run,
                          seed_runs, train_cmd)
from provenance import browser_version, cpu_model
from run_records import STARTS, RunRecords, with_dynamics
from seed_stats import arm_differences, pool_evals, run_dynamics, seed_summary

RECIPES = ("constT10", "grpo", "raftpp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", required=True, help="warm-start params (launch/sft.py --workdir) shared by every arm")
    parser.add_argument("--out", required=True, help="one subdirectory per arm: OUT/<recipe>/{rl,eval}")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated configs/<name>.py")
    parser.add_argument("--variant", default="tiny", help="config variant of every arm")
    parser.add_argument("--steps", type=int, default=12, help="optimizer updates per arm")
    parser.add_argument("--eval_seeds", type=int, default=20, help="held-out instances per task")
    parser.add_argument("--eval_workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="runs per arm from the one warm start, seeds 0..N-1")
    parser.add_argument("--sft_eval", default=None,
                        help="the warm start's eval dir (default: SFT/../eval_sft), or several, comma-separated: "
                             "evals of it with other sampling seeds, pooled (bench/seed_stats.py pool_evals)")
    parser.add_argument("--learning", default=None, help="learning_run.py JSON whose RL seeds are one more arm")
    parser.add_argument("--resume", action="store_true",
                        help="reuse every run already trained to --steps and evaluated (after a crash, or to summarise "
                             "the same runs against another --sft_eval)")
    parser.add_argument("--json", default=None, help="also write the JSON here (e.g. docs/results/paper_regime/"
                                                    "ablation.json)")
    parser.add_argument("--record", default=None,
                        help="write every finished run to RECORD/<recipe>/seed<s>.json and, with --resume, take "
                             "runs missing from --out from there (keyed by the warm start's params digest)")
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides for every arm (after --)")
    args = parser.parse_args()
    check_seeds(args.seeds, args.override, "ablation")
    out, sft = os.path.abspath(args.out), os.path.abspath(args.sft)
    sft_eval_dir = args.sft_eval or os.path.join(os.path.dirname(sft), "eval_sft")
    after_sft = sft_eval(sft_eval_dir)
    check_instances(after_sft, args.eval_seeds, "ablation", sft_eval_dir)
    recipes = [r for r in args.recipes.split(",") if r]
    for recipe in recipes:
        if not os.path.isfile(os.path.join(ROOT, "configs", f"{recipe}.py")):
            raise SystemExit(f"ablation: no recipe configs/{recipe}.py (see configs/)")
    learned = dict([learning_arm(args.learning, args, recipes, after_sft)]) if args.learning else {}
    plans = {recipe: seed_runs(os.path.join(out, recipe), args.seeds, "eval") for recipe in recipes}
    records = RunRecords(args.record, sft, recipes, args) if args.record and recipes else None
    runs: dict[str, list[dict]] = {recipe: [] for recipe in recipes}
    for i in range(len(plans[recipes[0]]) if recipes else 0):   # seed by seed over the arms: a stopped ablation
        for recipe in recipes:                                  # leaves them balanced, and its JSON says so
            runs[recipe].append(train_and_eval(recipe, *plans[recipe][i], sft, args, records))
            result = write_result(learned, runs, after_sft, sft, out, args, recipes)
    if not recipes:
        result = write_result(learned, runs, after_sft, sft, out, args, recipes)
    print(json.dumps(result))


def train_and_eval(recipe: str, seed: int | None, workdir: str, eval_dir: str, sft: str, args,
                   records: "RunRecords | None" = None) -> dict:
    """One arm's run for one seed: trained to --steps from the warm start and evaluated (reused with --resume
    when both are done, or taken from its --record), with its curve, dynamics and wall times."""
    config = f"configs/{recipe}.py:{args.variant}"
    walls = finished_walls(workdir, eval_dir, args.steps) if args.resume else None
    if walls is None and args.resume and records is not None:
        recorded = records.load(recipe, seed)
        if recorded is not None:
            return recorded
    trained = walls is None
    if trained:
        restore = records.carried_start(recipe, seed, workdir) if records is not None and args.resume else None
        note_start(workdir)
        override = [*args.override, f"--config.checkpoint.restore_from={restore}"] if restore else args.override
        with records.carrying(recipe, seed, workdir) if records is not None else contextlib.nullcontext():
            train_s = run(train_cmd(config, workdir, init_params=sft, max_steps=args.steps, seed=seed,
                                    override=override))
        eval_args = argparse.Namespace(config=config, eval_seeds=args.eval_seeds,
                                       eval_workers=args.eval_workers, override=args.override)
        walls = {"train_s": train_s, "eval_s": run(eval_cmd(eval_args, workdir, eval_dir))}
        with open(os.path.join(eval_dir, WALLS), "w", encoding="utf-8") as f:
            json.dump(walls, f)
    rl_curve, summary = curve(workdir), eval_summary(eval_dir)
    starts = run_starts(workdir)
    result = {"seed": seed, "eval": summary, "curve": rl_curve, "dynamics": run_dynamics(rl_curve),
              **walls, "memory_chars": (summary or {}).get("memory_chars"), "starts": starts,
              "resumed": sum(start["from_update"] > 0 for start in starts)}
    if records is not None and (trained or not os.path.isfile(records.path(recipe, seed))):
        records.save(recipe, seed, result)   # a resumed run keeps the record (and commit) it was trained at
    return result


def git_commit() -> str | None:
    """The checkout's commit (short), or None outside a git checkout."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout.strip() or None


def run_starts(workdir: str) -> list[dict]:
    """Every start of this run's training so far ([] for a run made before they were kept)."""
    path = os.path.join(workdir, STARTS)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def note_start(workdir: str) -> None:
    """Keep this start of the run's training (the commit, the updates its workdir already holds, the Chromium and
    CPU it runs on): a start on a workdir with updates continues from its checkpoint (launch/train.py), so it counts
    as a resume, and a resume on another browser or CPU is told apart (the warm start's eval is not the same there)."""
    starts = run_starts(workdir) + [{"commit": git_commit(), "from_update": len(curve(workdir)),
                                     "browser": browser_version(), "cpu": cpu_model()}]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, STARTS + ".tmp"), "w", encoding="utf-8") as f:
        json.dump(starts, f)
    os.replace(os.path.join(workdir, STARTS + ".tmp"), os.path.join(workdir, STARTS))


def write_result(learned: dict, runs: dict, after_sft: dict | None, sft: str, out: str, args, recipes) -> dict:
    """The ablation's JSON from the runs so far (OUT/ablation.json, and --json): `complete` says whether every
    arm has --seeds runs."""
    arms = dict(learned)
    for recipe, done in runs.items():
        arms[recipe] = {"runs": done, "summary": arm_summary(after_sft, done)}
        if args.seeds == 1 and done:   # the single-run layout of earlier JSONs
            arms[recipe].update({k: v for k, v in done[0].items() if k != "seed"})
    for arm in arms.values():
        arm["seeds"] = [seed_record(r) for r in arm["runs"] if r["eval"]]
    result = {"sft": sft, "after_sft": after_sft, "steps": args.steps, "variant": args.variant, "seeds": args.seeds,
              "complete": all(len(done) == args.seeds for done in runs.values()),
              "overrides": args.override, "eval_seeds": [1_000_000, 1_000_000 + args.eval_seeds - 1],
              "horizons": horizons(recipes[0] if recipes else None, args), "arms": arms,
              "arm_differences": arm_differences({arm: a["summary"]["rl_success"] for arm, a in arms.items()}),
              "split_differences": split_differences(arms), "paired_differences": paired_differences(arms)}
    os.makedirs(out, exist_ok=True)
    for path in [os.path.join(out, "ablation.json")] + ([args.json] if args.json else []):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return result


def seed_record(run: dict) -> dict:
    """One seed's headline numbers (the issue's per-seed record): held-out success overall and per difficulty
    split, mean steps of successes and failures and their ratio, the share of failures that ran to the horizon,
    memory characters a step (and by outcome, keys, generic share), the clipped fraction and seconds an update."""
    e, d = run["eval"], run["dynamics"]
    ratio = (e["steps_failure"] / e["steps_success"]) if e.get("steps_failure") and e.get("steps_success") else None
    return {"seed": run["seed"], "success": e["success"], "success_by_split": e.get("splits", {}),
            "mean_steps_success": e.get("steps_success"), "mean_steps_failure": e.get("steps_failure"),
            "failure_success_length_ratio": ratio, "failures_at_horizon": e.get("failures_at_horizon"),
            "memory_chars_mean": e.get("memory_chars"), "memory_chars_success": e.get("memory_chars_success"),
            "memory_chars_failure": e.get("memory_chars_failure"), "memory_keys_mean": e.get("memory_keys"),
            "memory_generic_frac": e.get("memory_generic_frac"), "clip_mean": d.get("clip_mean"),
            "s_per_update": d.get("s_per_update"), "train_s": run.get("train_s"), "resumed": run.get("resumed"),
            "train_failure_success_length_ratio": d.get("train_failure_success_ratio"),
            "memory_chars_curve": [row.get("memory_chars") for row in run["curve"]]}


# a per-seed measure -> (docs/learning.md's prediction for constT10 - grpo, scale to its unit, predicted sign (0:
# non-inferior), smallest effect of interest in that unit), judged by the JAX lab's rules (bench/lab_table.py)
PAIRED = {"mean_steps_failure": ("B1 shorter failures", 1.0, -1, 0.5),
          "success": ("B3 success equal or better (points)", 100.0, 0, 2.0),
          "memory_chars_mean": ("B2 shorter memory (characters a step)", 1.0, -1, 1.0),
          "clip_mean": ("B5 fewer clipped tokens (points)", 100.0, -1, 0.1)}


def paired_differences(arms: dict) -> dict:
    """Per pair of arms "a - b" and per PAIRED measure: d_s = a_s - b_s over the seeds both arms hold, paired by seed
    number (one warm start, the same eval instances and sampling seeds), with its mean, 95% t-interval and MDE
    (`lab_table.interval`) and, for constT10 - grpo, the prediction's verdict (docs/learning.md, "The browser regime
    with power")."""
    names, out = list(arms), {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            mine, theirs = ({r["seed"]: r for r in arms[name].get("seeds", [])} for name in (a, b))
            both = sorted(set(mine) & set(theirs), key=str)
            rows = {}
            for measure, (prediction, scale, sign, sesoi) in PAIRED.items():
                diffs = [scale * (mine[s][measure] - theirs[s][measure]) for s in both
                         if mine[s].get(measure) is not None and theirs[s].get(measure) is not None]
                rows[measure] = {"prediction": prediction, "seeds": both, **interval(diffs)}
                if (a, b) == ("constT10", "grpo"):
                    rows[measure]["verdict"] = verdict(rows[measure], sign, sesoi)
            out[f"{a} - {b}"] = rows
    return out


def recorded_arms(root: str) -> dict:
    """{recipe: {"seeds": [seed_record, ...]}} of the finished runs recorded under `root` (--record's
    <recipe>/seed<s>.json), seeds in number order, their dynamics derived from the curve by today's code, each with
    its `warm_start` (the digest's first 8 hex digits): what `paired_differences` reads, before the study's
    ablation JSON exists."""
    arms = {}
    for recipe in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        folder = os.path.join(root, recipe)
        names = sorted((f for f in os.listdir(folder) if f.startswith("seed") and f.endswith(".json")),
                       key=lambda f: int(f[4:-5] or -1))
        seeds = []
        for name in names:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                record = json.load(f)
            seeds.append({**seed_record(with_dynamics(record["run"])),
                          "warm_start": record.get("warm_start_sha256", "")[:8]})
        if seeds:
            arms[recipe] = {"seeds": seeds}
    return arms


def paired_markdown(paired: dict, pair: str = "constT10 - grpo") -> str:
    """`paired_differences(...)[pair]` as docs/learning.md's table: prediction, seeds paired, mean difference and its
    95% interval, MDE, verdict (unresolved below two pairs)."""
    lines = [f"| prediction | pairs | {pair.replace(' - ', ' − ')} (95% CI) | MDE | verdict |",
             "|---|---|---|---|---|"]
    for row in paired[pair].values():
        ci = "" if row["ci95"] is None else f"{signed(row['mean'])} ± {row['ci95']:.2f}"
        mde = "" if row["mde"] is None else f"{row['mde']:.2f}"
        lines.append(f"| {row['prediction']} | {row['n']} | {ci or signed(row['mean'])} | {mde} | {row['verdict']} |")
    return "\n".join(lines)


def split_differences(arms: dict) -> dict:
    """Per difficulty split: every pair of arms' difference of mean held-out success ± SE (`arm_differences`)."""
    splits = sorted({s for a in arms.values() for r in a.get("seeds", []) for s in r["success_by_split"]})
    return {split: arm_differences({name: [r["success_by_split"][split] for r in a.get("seeds", [])
                                           if r["success_by_split"].get(split) is not None]
                                    for name, a in arms.items()})
            for split in splits}


def learning_arm(path: str, args, recipes: list[str], after_sft: dict | None) -> tuple[str, dict]:
    """(recipe, arm) from a bench/learning_run.py JSON's RL seeds; one-line exit when it is not comparable."""
    with open(path, encoding="utf-8") as f:
        learning = json.load(f)
    recipe = recipe_name(learning["config"])
    if recipe in recipes:
        raise SystemExit(f"ablation: {recipe} is in --recipes and in --learning={path}: drop it from --recipes")
    if learning.get("rl_steps") != args.steps:
        raise SystemExit(f"ablation: --learning={path} trained {learning.get('rl_steps') or 'a wall-clock budget'}"
                         f" updates per seed, not --steps={args.steps}: pass --steps={learning.get('rl_steps')}")
    check_instances(learning, args.eval_seeds, "ablation", path)
    runs = [{"seed": r["seed"], "eval": r["after_rl"], "curve": r["rl_curve"], "dynamics": run_dynamics(r["rl_curve"]),
             "train_s": r["wall_s"].get("rl"), "eval_s": r["wall_s"].get("eval_rl")} for r in learning["rl_seeds"]]
    return recipe, {"from": os.path.abspath(path), "runs": runs, "summary": arm_summary(after_sft, runs)}


def sft_eval(dirs: str) -> dict | None:
    """The warm start's eval summary from one eval dir, or several comma-separated ones pooled; one-line exit
    when one of several is missing or they played other instances."""
    paths = [d for d in dirs.split(",") if d]
    if len(paths) == 1:
        return eval_summary(paths[0])
    summaries = [eval_summary(p) for p in paths]
    missing = [p for p, summary in zip(paths, summaries) if summary is None]
    if missing:
        raise SystemExit(f"ablation: --sft_eval {missing[0]} holds no eval.json: run launch/eval.py there or drop it")
    try:
        return pool_evals(summaries)
    except ValueError as err:
        raise SystemExit(f"ablation: --sft_eval: {err}") from None


WALLS = "walls.json"   # next to a run's eval.json: its train and eval wall seconds, for --resume


def finished_walls(workdir: str, eval_dir: str, steps: int) -> dict | None:
    """A run --resume can reuse: trained to `steps` updates and evaluated. Its wall times (None for a run made
    before they were recorded), or None when it must run (again)."""
    if len(curve(workdir)) < steps or not os.path.exists(os.path.join(eval_dir, "eval.json")):
        return None
    path = os.path.join(eval_dir, WALLS)
    if not os.path.exists(path):
        return {"train_s": None, "eval_s": None}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def arm_summary(after_sft: dict | None, runs: list[dict]) -> dict:
    """bench/seed_stats.py's seed summary of an arm's evaluated runs, their dynamics included."""
    evaluated = [r for r in runs if r["eval"]]
    return seed_summary(after_sft, [r["eval"] for r in evaluated], [r["dynamics"] for r in evaluated])


def horizons(recipe: str | None, args) -> dict:
    """Each task's own horizon in this variant (env.tasks under the arms' config and overrides)."""
    if recipe is None:
        return {}
    config = apply_overrides(importlib.import_module(f"configs.{recipe}").get_config(args.variant), args.override)
    return {spec: task_horizon(check_env_spec(spec), config.env.max_episode_steps)
            for spec in env_specs(config.env.tasks)}


if __name__ == "__main__":
    main()
