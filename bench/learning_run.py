r"""The CPU learning run, end to end: scripted-demonstration SFT warm start, then constT10 RL on top (once, or
once per seed), each stage evaluated on the same held-out MiniWoB++ instances. Prints one JSON object (and writes it
to OUT/learning_run.json).

    python bench/learning_run.py --out=/tmp/learning_run                  # defaults: docs/learning.md's numbers
    python bench/learning_run.py --out=/tmp/lr --rl_minutes=5 --stages=sft,eval_sft,rl,eval_rl
    python bench/learning_run.py --out=/tmp/lr --rl_steps=15 --eval_seeds=40   # an update budget instead of a clock
    python bench/learning_run.py --out=/tmp/lr --rl_steps=15 --eval_seeds=40 --seeds=5   # RL with seeds 0..4

Stages (each a launch/ command, printed before it runs, so any one can be rerun by hand):
  sft        launch/sft.py: oracle demonstrations on TRAINING seeds 0..sft_seeds-1 -> OUT/sft (params checkpoint)
  eval_init  launch/eval.py --policy=initial: the random tiny policy -> OUT/eval_initial
  eval_sft   launch/eval.py --policy=OUT/sft -> OUT/eval_sft
  rl         launch/train.py --config.model.init_params=OUT/sft for --rl_minutes of wall clock (then SIGINT: the
             supervisor saves and stops; every step is checkpointed), or for --rl_steps updates -> OUT/rl
  eval_rl    launch/eval.py --policy=OUT/rl (its latest checkpoint) -> OUT/eval_rl

Seeds: with --seeds=N > 1 the SFT warm start and its eval are shared and the RL stage runs N times from it, with
--config.seed=s for s in 0..N-1 (what it changes: the workers' task and instance draws and the policy server's
sampling; the update draws nothing) -> OUT/rl_seed<s>, each evaluated -> OUT/eval_rl_seed<s>. --seeds=1 runs the
recipe's own seed in OUT/rl, as before. Every eval (the config's own seed) plays the same held-out instances. The
JSON's `rl_seeds` lists every seed's held-out success (overall and per task), curve and wall times; `summary`
(bench/seed_stats.py) the mean RL success, each seed's RL − SFT difference, their mean ± SE (sample std / sqrt(N)),
the seeds where RL beat SFT, the same per task, and each eval's own binomial SE.

Held-out seeds: evaluation plays seeds 1_000_000 .. 1_000_000+eval_seeds-1 of every task (launch/eval.py's
default range); SFT demonstrations use seeds below 1_000_000 and RL workers draw seeds at random from [0, 2**31).
The JSON holds per-task and overall success of each evaluated stage, the RL training curve (rollout success per
train step, from metrics.jsonl) and the wall time of every stage; with one seed also `after_rl` and `rl_curve` at
the top level, as before.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from seed_stats import run_dynamics, seed_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("sft", "eval_init", "eval_sft", "rl", "eval_rl")


def run(cmd: list[str], *, seconds: float | None = None) -> float:
    """Run `cmd` in the repo root (output passes through); with `seconds`, SIGINT it then. Returns wall seconds."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sys.stderr)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)   # the supervisor saves its state and stops every child
        proc.wait(timeout=600)
    if proc.returncode not in (0, -signal.SIGINT, 130) or (seconds is None and proc.returncode != 0):
        raise SystemExit(f"learning run: {' '.join(cmd[:2])} exited with {proc.returncode}")
    return round(time.monotonic() - start, 1)


def eval_cmd(args, policy: str, out_dir: str) -> list[str]:
    return [sys.executable, "launch/eval.py", f"--config={args.config}", f"--policy={policy}", f"--out_dir={out_dir}",
            f"--num_seeds={args.eval_seeds}", f"--num_workers={args.eval_workers}", *args.override]


def recipe_name(config: str) -> str:
    """"configs/constT10.py:tiny" -> "constT10"."""
    return os.path.splitext(os.path.basename(config.split(":")[0]))[0]


def seed_runs(out: str, seeds: int, eval_name: str) -> list[tuple[int | None, str, str]]:
    """(seed, RL workdir, its eval dir) for every RL run: one seed keeps OUT/rl, OUT/<eval_name> and the recipe's
    own seed (None); N > 1 runs seeds 0..N-1 in OUT/rl_seed<s>, OUT/<eval_name>_seed<s>."""
    if seeds == 1:
        return [(None, os.path.join(out, "rl"), os.path.join(out, eval_name))]
    return [(s, os.path.join(out, f"rl_seed{s}"), os.path.join(out, f"{eval_name}_seed{s}")) for s in range(seeds)]


def train_cmd(config: str, workdir: str, *, init_params: str, max_steps: int, seed: int | None,
              override: list[str]) -> list[str]:
    """launch/train.py from the warm start `init_params`; `seed` (None: the recipe's) is its --config.seed."""
    cmd = [sys.executable, "launch/train.py", f"--config={config}", f"--workdir={workdir}",
           f"--config.model.init_params={init_params}", f"--config.train.max_steps={max_steps}",
           "--config.metrics.progress_bar=False", *override]
    return cmd if seed is None else [*cmd, f"--config.seed={seed}"]


def check_seeds(seeds: int, override: list[str], who: str) -> None:
    """One-line exit on a seed count below 1, or on a --config.seed override that --seeds would contradict."""
    if seeds < 1:
        raise SystemExit(f"{who}: --seeds={seeds}: use 1 or more")
    if seeds > 1 and any(o.startswith("--config.seed=") for o in override):
        raise SystemExit(f"{who}: --seeds={seeds} sets --config.seed of every RL run (0..{seeds - 1}): drop the "
                         f"--config.seed override")


def check_instances(summary: dict | None, eval_seeds: int, who: str, what: str) -> None:
    """One-line exit when an existing eval (`summary`) played other held-out instances than --eval_seeds would."""
    want = [1_000_000, 1_000_000 + eval_seeds - 1]
    if summary is not None and summary.get("eval_seeds") not in (None, want):
        raise SystemExit(f"{who}: {what} played held-out seeds {summary['eval_seeds']}, not {want}: rerun it or pass "
                         f"--eval_seeds={summary['eval_seeds'][1] - summary['eval_seeds'][0] + 1}")


def eval_summary(out_dir: str) -> dict | None:
    path = os.path.join(out_dir, "eval.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    return {"success": report["overall"]["success_rate"], "episodes": report["overall"].get("episodes"),
            "tasks": {task: row["success_rate"] for task, row in report["tasks"].items()},
            "task_episodes": {task: row.get("episodes") for task, row in report["tasks"].items()},
            "eval_seeds": [min(report["setup"]["seeds"]), max(report["setup"]["seeds"])],
            "steps_success": report["overall"]["steps_success"], "steps_failure": report["overall"]["steps_failure"],
            "splits": {split: row["success_rate"] for split, row in report.get("splits", {}).items()},
            **{key: report["overall"].get(key) for key in EVAL_EXTRAS},
            "wall_s": report["setup"]["wall_s"]}


# eval.json's overall figures an eval summary carries too (None in reports made before they existed)
EVAL_EXTRAS = ("failures_at_horizon", "memory_chars", "memory_chars_success", "memory_chars_failure",
               "memory_keys", "memory_generic_frac")


def curve(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "rollout/success_rate" in row:   # the trained batch (dynamic sampling keeps it near 50%) and
                seen = row.get("rollout/success_rate_seen")   # every episode read since the previous step
                out.append({"step": row["step"], "success": round(row["rollout/success_rate"], 3),
                            "success_seen": _rounded(seen), "staleness": _rounded(row.get("rollout/staleness/mean")),
                            "kl": _rounded(row.get("ppo_actor/update/approx_kl_abs/avg"), 4),   # |new − prox|
                            "behave_kl": _rounded(row.get("ppo_actor/update/behave_approx_kl_abs/avg"), 4),
                            "clip": _rounded(row.get("ppo_actor/update/clip_ratio/avg"), 4),
                            "memory_chars": _rounded(row.get("rollout/memory_chars/avg"), 2),
                            "steps_success": _rounded(row.get("rollout/steps_success/avg"), 2),   # the trained
                            "steps_failure": _rounded(row.get("rollout/steps_failure/avg"), 2),   # batch's
                            "time": row.get("time")})
    return out


def _rounded(value, digits: int = 3):
    """A metric rounded for the JSON; None when it is missing or NaN."""
    return None if value is None or value != value else round(float(value), digits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="run directory (one subdirectory per stage)")
    parser.add_argument("--config", default="configs/constT10.py", help="recipe[:variant] of every stage")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {STAGES}")
    parser.add_argument("--sft_steps", type=int, default=100, help="100: ~47%% held out, room for RL")
    parser.add_argument("--sft_seeds", type=int, default=64, help="training instances per task for demonstrations")
    parser.add_argument("--rl_minutes", type=float, default=30.0, help="RL wall-clock budget")
    parser.add_argument("--rl_steps", type=int, default=0, help="RL budget in updates instead (0: --rl_minutes)")
    parser.add_argument("--eval_seeds", type=int, default=20, help="held-out instances per task")
    parser.add_argument("--eval_workers", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=1, help="RL runs from the one warm start, --config.seed 0..N-1")
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides passed to every stage (after --)")
    args = parser.parse_args()
    check_seeds(args.seeds, args.override, "learning run")
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise SystemExit(f"unknown stage(s) {sorted(unknown)}: use {STAGES}")
    out = os.path.abspath(args.out)
    sft = os.path.join(out, "sft")
    if "eval_sft" not in stages:   # RL is compared with an earlier SFT eval: it must have played the same instances
        check_instances(eval_summary(os.path.join(out, "eval_sft")), args.eval_seeds, "learning run", "OUT/eval_sft")
    os.makedirs(out, exist_ok=True)
    walls = {}
    if "sft" in stages:
        walls["sft"] = run([sys.executable, "launch/sft.py", f"--config={args.config}", f"--workdir={sft}",
                            f"--steps={args.sft_steps}", f"--num_seeds={args.sft_seeds}", *args.override])
    if "eval_init" in stages:
        walls["eval_init"] = run(eval_cmd(args, "initial", os.path.join(out, "eval_initial")))
    if "eval_sft" in stages:
        walls["eval_sft"] = run(eval_cmd(args, sft, os.path.join(out, "eval_sft")))
    rl_seeds = []
    for seed, rl, eval_dir in seed_runs(out, args.seeds, "eval_rl"):
        seed_walls = {}
        if "rl" in stages:
            max_steps = args.rl_steps or 100000   # an update budget runs to the end; otherwise the clock stops it
            seed_walls["rl"] = run(train_cmd(args.config, rl, init_params=sft, max_steps=max_steps, seed=seed,
                                             override=args.override),
                                   seconds=None if args.rl_steps else args.rl_minutes * 60)
        if "eval_rl" in stages:
            if curve(rl):
                seed_walls["eval_rl"] = run(eval_cmd(args, rl, eval_dir))
            else:
                print(f"learning run: {rl} holds no train step yet (raise --rl_minutes): eval_rl skipped",
                      file=sys.stderr)
        rl_curve = curve(rl)
        rl_seeds.append({"seed": seed, "after_rl": eval_summary(eval_dir), "rl_curve": rl_curve,
                         "dynamics": run_dynamics(rl_curve), "wall_s": seed_walls})
        for stage, wall in seed_walls.items():   # the totals over seeds (one seed: that seed's, as before)
            walls[stage] = round(walls.get(stage, 0.0) + wall, 1)
    sft_record = os.path.join(sft, "sft.json")
    after_sft = eval_summary(os.path.join(out, "eval_sft"))
    result = {
        "config": args.config, "overrides": args.override, "eval_seeds": [1_000_000, 1_000_000 + args.eval_seeds - 1],
        "rl_steps": args.rl_steps or None, "rl_minutes": None if args.rl_steps else args.rl_minutes,
        "sft": {k: v for k, v in json.load(open(sft_record)).items() if k != "losses"}
        if os.path.exists(sft_record) else None,
        "initial": eval_summary(os.path.join(out, "eval_initial")),
        "after_sft": after_sft,
        "seeds": args.seeds,
        "rl_seeds": rl_seeds,
        "summary": seed_summary(after_sft, [r["after_rl"] for r in rl_seeds if r["after_rl"]],
                                [r["dynamics"] for r in rl_seeds if r["after_rl"]]),
        "wall_s": walls,
    }
    if args.seeds == 1:   # the single-run layout of earlier JSONs
        result.update(after_rl=rl_seeds[0]["after_rl"], rl_curve=rl_seeds[0]["rl_curve"])
    with open(os.path.join(out, "learning_run.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
