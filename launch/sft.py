r"""Supervised warm start from scripted demonstrations:
`python launch/sft.py --config=configs/constT10.py[:variant] --workdir=DIR [--steps=N] [--num_seeds=S]
    [--seed_start=0] [--batch_size=B] [--lr=LR] [--config.a.b=v]`.

The oracles play the recipe's tasks (`env.tasks`, each needs an oracle: `jaxwebrl.env.tasks.miniwob.oracles.oracle_tasks()`)
on the TRAINING seeds seed_start .. seed_start+S-1, recorded exactly as the recipe's rollout workers prompt
(clicks snapped to the constrained action space); the recipe's initial policy is trained on their winning
episodes for --steps and DIR receives a params checkpoint (params/, jaxwebrl_params.json) and sft.json
(demonstration counts, losses). Start RL from it at step 0 with a fresh optimizer, and evaluate it:

    python launch/train.py --config=configs/constT10.py --workdir=RL --config.model.init_params=DIR
    python launch/eval.py --config=configs/constT10.py --policy=DIR --out_dir=DIR/eval

Seed split (`jaxwebrl/seeds.py`): demonstrations use seeds below EVAL_SEED_START = 1_000_000; launch/eval.py
holds out 1_000_000 and up, and RL workers draw instance seeds at random from [0, 2**31).
"""

import json
import os

from absl import app, flags

from jaxwebrl import cli
from jaxwebrl.seeds import EVAL_SEED_START

_WORKDIR = cli.define_workdir_flag("new directory for the params checkpoint and sft.json")
_STEPS = flags.DEFINE_integer("steps", 200, "SFT optimizer steps")
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 64, "training instances per task the oracle plays")
_SEED_START = flags.DEFINE_integer("seed_start", 0, f"first training instance seed (must stay below {EVAL_SEED_START})")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "demonstration steps per SFT step")
_LR = flags.DEFINE_float("lr", 1e-3, "AdamW learning rate of the SFT steps")
_LOG_EVERY = flags.DEFINE_integer("log_every", 25, "print the mean loss every N steps (0: never)")


def main(argv) -> int:
    del argv
    workdir = _WORKDIR.value
    if not workdir:
        cli.exit_with("config error: --workdir is required, e.g. --workdir=/tmp/sft")
    config = cli.validated_config(workdir)
    if _STEPS.value < 1 or _NUM_SEEDS.value < 1 or _BATCH_SIZE.value < 1 or not _LR.value > 0:
        cli.exit_with("sft error: --steps, --num_seeds and --batch_size must be >= 1 and --lr > 0")
    if _SEED_START.value < 0 or _SEED_START.value + _NUM_SEEDS.value > EVAL_SEED_START:
        cli.exit_with(f"sft error: training seeds {_SEED_START.value}..{_SEED_START.value + _NUM_SEEDS.value - 1} "
                      f"must lie in [0, {EVAL_SEED_START}): launch/eval.py holds out {EVAL_SEED_START} and up")
    if os.path.exists(os.path.join(workdir, "params")):
        cli.exit_with(f"sft error: {workdir}/params exists: choose a new --workdir (a warm start is never "
                      f"overwritten)")
    from jaxwebrl.eval.sft import warm_start  # deferred: JAX starts once the flags are known to be good

    seeds = range(_SEED_START.value, _SEED_START.value + _NUM_SEEDS.value)
    summary = warm_start(config, workdir, seeds=seeds, steps=_STEPS.value, batch_size=_BATCH_SIZE.value,
                         lr=_LR.value, log_every=_LOG_EVERY.value)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error"))
