r"""The paper's ablation at CPU scale: constT10 (1/k) vs grpo (1/|τ|) vs raftpp (success-filtered cloning), each
trained for the same number of updates from the same SFT warm start, on the same tasks, then evaluated on the
same held-out instances. Prints one JSON object (and writes OUT/ablation.json).

    python bench/learning_run.py --out=/tmp/lr --stages=sft                       # the shared warm start
    python bench/ablation.py --sft=/tmp/lr/sft --out=/tmp/ablation --steps=12     # three arms, then eval each

Per arm: held-out success, mean steps of successful and of failed episodes (does 1/k shorten failures, as the
paper found?), memory size, and the training curve. The budget is a number of updates, not wall clock, so the
arms stay comparable when the machine's load changes; each arm's wall time is reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from learning_run import curve, eval_cmd, eval_summary, run  # noqa: E402

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
    parser.add_argument("override", nargs="*", help="--config.a.b=v overrides for every arm (after --)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    arms = {}
    for recipe in [r for r in args.recipes.split(",") if r]:
        config = f"configs/{recipe}.py:{args.variant}"
        if not os.path.isfile(config.partition(":")[0]):
            raise SystemExit(f"ablation: no recipe {config.partition(':')[0]} (see configs/)")
        workdir, eval_dir = os.path.join(out, recipe, "rl"), os.path.join(out, recipe, "eval")
        train_s = run([sys.executable, "launch/train.py", f"--config={config}", f"--workdir={workdir}",
                       f"--config.model.init_params={os.path.abspath(args.sft)}", f"--config.train.max_steps={args.steps}",
                       "--config.metrics.progress_bar=False", *args.override])
        eval_args = argparse.Namespace(config=config, eval_seeds=args.eval_seeds, eval_workers=args.eval_workers,
                                       override=args.override)
        eval_s = run(eval_cmd(eval_args, workdir, eval_dir))
        arms[recipe] = {"eval": eval_summary(eval_dir), "curve": curve(workdir), "train_s": train_s, "eval_s": eval_s,
                        "memory_chars": _memory_chars(eval_dir)}
    result = {"sft": os.path.abspath(args.sft), "steps": args.steps, "variant": args.variant,
              "overrides": args.override, "eval_seeds": [1_000_000, 1_000_000 + args.eval_seeds - 1], "arms": arms}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ablation.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


def _memory_chars(eval_dir: str) -> float | None:
    path = os.path.join(eval_dir, "eval.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)["overall"].get("memory_chars")


if __name__ == "__main__":
    main()
