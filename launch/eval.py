r"""Evaluate a policy: `python launch/eval.py --config=configs/constT10.py[:variant] --policy=initial|WORKDIR|DIR
    --out_dir=DIR [--tasks=miniwob/click-test,...] [--num_seeds=N] [--seed_start=S] [--episodes_per_seed=E]
    [--num_workers=W] [--temperature=T] [--step=N]`.

Plays every task on the same seeds (S .. S+N-1) with the recipe's worker settings through the policy server
and real rollout workers, and writes DIR/eval.json and DIR/eval.md (success by Easy/Medium/Hard split and by
task, steps of successes vs failures, invalid-action rate, memory size), and DIR/eval/index.html, the trajectory
viewer (every episode step by step: screenshot, prompt, memory, action, reward; open it in a browser). --policy=initial evaluates the
recipe's untrained policy (the baseline); a workdir or checkpoints/ dir its latest (or --step) checkpoint; an
exported params or HF directory that policy.
"""

import json
import os

from absl import app, flags

from jaxwebrl import cli
from jaxwebrl.seeds import EVAL_SEED_START

_POLICY = flags.DEFINE_string("policy", "initial", "'initial', a workdir, its checkpoints/ dir, a params or HF dir")
_STEP = flags.DEFINE_integer("step", None, "training step of a checkpoint (default: the latest)")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "where eval.json and eval.md go")
_TASKS = flags.DEFINE_string("tasks", None, "comma-separated env specs (default: the recipe's env.tasks)")
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 4, "instances per task")
_SEED_START = flags.DEFINE_integer("seed_start", EVAL_SEED_START, "first instance seed (held out from training)")
_EPISODES = flags.DEFINE_integer("episodes_per_seed", 1, "episodes per instance")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 1, "rollout workers playing in parallel (one browser each)")
_TEMPERATURE = flags.DEFINE_float("temperature", None, "sampling temperature (default: the recipe's; 0 = greedy)")
_TITLE = flags.DEFINE_string("title", None, "row name in the Markdown table (default: the policy source)")


def main(argv):
    del argv
    if not _OUT_DIR.value:
        raise app.UsageError("--out_dir is required, e.g. --config=configs/constT10.py:toy --policy=initial "
                             "--out_dir=/tmp/eval_initial")
    if _NUM_SEEDS.value < 1 or _EPISODES.value < 1 or _NUM_WORKERS.value < 1:
        raise app.UsageError("--num_seeds, --episodes_per_seed and --num_workers must be >= 1")
    config = cli.loaded_config(workdir=_POLICY.value)   # a workdir's config.json, overrides on top
    from jaxwebrl.checkpoint.policies import load_policy  # deferred: JAX starts once the flags are known to be good
    from jaxwebrl.eval.evaluate import evaluate

    tasks = [t.strip() for t in _TASKS.value.split(",") if t.strip()] if _TASKS.value else None
    try:
        policy, info = load_policy(config, _POLICY.value, step=_STEP.value)
    except (FileNotFoundError, ValueError) as err:
        cli.exit_with(f"eval error: {err}")
    seeds = range(_SEED_START.value, _SEED_START.value + _NUM_SEEDS.value)
    title = _TITLE.value or (_POLICY.value if _POLICY.value == "initial" else os.path.basename(_POLICY.value.rstrip("/")))
    report = evaluate(config, policy, tasks=tasks, seeds=seeds, episodes_per_seed=_EPISODES.value,
                      num_workers=_NUM_WORKERS.value, temperature=_TEMPERATURE.value, out_dir=_OUT_DIR.value,
                      policy_info=info, title=title)
    with open(os.path.join(_OUT_DIR.value, "eval.md"), encoding="utf-8") as f:
        print(f.read())
    print(json.dumps({"overall": report["overall"], "splits": {k: v["success_rate"] for k, v in report["splits"].items()}}))
    print(f"trajectory viewer: file://{os.path.abspath(os.path.join(_OUT_DIR.value, 'eval', 'index.html'))}")


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error"))
