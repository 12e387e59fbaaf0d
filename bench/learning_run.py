r"""The CPU learning run, end to end: scripted-demonstration SFT warm start, then constT10 RL on top, each stage
evaluated on the same held-out MiniWoB++ instances. Prints one JSON object (and writes it to OUT/learning_run.json).

    python bench/learning_run.py --out=/tmp/learning_run                  # defaults: the README's numbers
    python bench/learning_run.py --out=/tmp/lr --rl_minutes=5 --stages=sft,eval_sft,rl,eval_rl
    python bench/learning_run.py --out=/tmp/lr --rl_steps=15 --eval_seeds=40   # an update budget instead of a clock

Stages (each a launch/ command, printed before it runs, so any one can be rerun by hand):
  sft        launch/sft.py: oracle demonstrations on TRAINING seeds 0..sft_seeds-1 -> OUT/sft (params checkpoint)
  eval_init  launch/eval.py --policy=initial: the random tiny policy -> OUT/eval_initial
  eval_sft   launch/eval.py --policy=OUT/sft -> OUT/eval_sft
  rl         launch/train.py --config.model.init_params=OUT/sft for --rl_minutes of wall clock (then SIGINT: the
             supervisor saves and stops; every step is checkpointed), or for --rl_steps updates -> OUT/rl
  eval_rl    launch/eval.py --policy=OUT/rl (its latest checkpoint) -> OUT/eval_rl

Held-out seeds: evaluation plays seeds 1_000_000 .. 1_000_000+eval_seeds-1 of every task (launch/eval.py's
default range); SFT demonstrations use seeds below 1_000_000 and RL workers draw seeds at random from [0, 2**31).
The JSON holds per-task and overall success of each evaluated stage, the RL training curve (rollout success per
train step, from OUT/rl/metrics.jsonl) and the wall time of every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

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


def eval_summary(out_dir: str) -> dict | None:
    path = os.path.join(out_dir, "eval.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    return {"success": report["overall"]["success_rate"], "episodes": report["overall"].get("episodes"),
            "tasks": {task: row["success_rate"] for task, row in report["tasks"].items()},
            "steps_success": report["overall"]["steps_success"], "steps_failure": report["overall"]["steps_failure"],
            "wall_s": report["setup"]["wall_s"]}


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
                            "success_seen": None if seen is None or seen != seen else round(seen, 3)})
    return out


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
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides passed to every stage (after --)")
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise SystemExit(f"unknown stage(s) {sorted(unknown)}: use {STAGES}")
    out = os.path.abspath(args.out)
    sft, rl = os.path.join(out, "sft"), os.path.join(out, "rl")
    os.makedirs(out, exist_ok=True)
    walls = {}
    py = sys.executable
    if "sft" in stages:
        walls["sft"] = run([py, "launch/sft.py", f"--config={args.config}", f"--workdir={sft}",
                            f"--steps={args.sft_steps}", f"--num_seeds={args.sft_seeds}", *args.override])
    if "eval_init" in stages:
        walls["eval_init"] = run(eval_cmd(args, "initial", os.path.join(out, "eval_initial")))
    if "eval_sft" in stages:
        walls["eval_sft"] = run(eval_cmd(args, sft, os.path.join(out, "eval_sft")))
    if "rl" in stages:
        max_steps = args.rl_steps or 100000   # an update budget runs to the end; otherwise the clock stops it
        walls["rl"] = run([py, "launch/train.py", f"--config={args.config}", f"--workdir={rl}",
                           f"--config.model.init_params={sft}", f"--config.train.max_steps={max_steps}",
                           "--config.metrics.progress_bar=False", *args.override],
                          seconds=None if args.rl_steps else args.rl_minutes * 60)
    if "eval_rl" in stages:
        if curve(rl):
            walls["eval_rl"] = run(eval_cmd(args, rl, os.path.join(out, "eval_rl")))
        else:
            print(f"learning run: {rl} holds no train step yet (raise --rl_minutes): eval_rl skipped", file=sys.stderr)
    sft_record = os.path.join(sft, "sft.json")
    result = {
        "config": args.config, "overrides": args.override, "eval_seeds": [1_000_000, 1_000_000 + args.eval_seeds - 1],
        "sft": {k: v for k, v in json.load(open(sft_record)).items() if k != "losses"}
        if os.path.exists(sft_record) else None,
        "initial": eval_summary(os.path.join(out, "eval_initial")),
        "after_sft": eval_summary(os.path.join(out, "eval_sft")),
        "after_rl": eval_summary(os.path.join(out, "eval_rl")),
        "rl_curve": curve(rl), "wall_s": walls,
    }
    with open(os.path.join(out, "learning_run.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
