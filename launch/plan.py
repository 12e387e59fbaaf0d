r"""Plan a deployment before renting it: the fleet model's predicted throughput, idle fractions, staleness and the
smallest browser count that keeps the trainer >= 90% busy. Prints one JSON object (docs/fleet_model.md).

  python launch/plan.py --config=configs/constT10.py:qwen3vl_8b --topology=v5p-8 --regime=web --browsers=64
  python launch/plan.py --config=configs/constT10.py --topology=cpu --regime=web --browsers=16   # this machine
  python launch/plan.py --config=configs/constT10.py --validate --out=docs/results/fleet/validation.json
  python launch/plan.py --config=configs/constT10.py:qwen3vl_8b --paper --out=docs/results/fleet/paper_regime.json

--topology: `cpu` (the measuring machine: everything on its cores, the tiny default's measured inputs), a TPU
slice with an AOT report in docs/results/compile (v5p-8), or `h200x8` (8 H200s, from the measured H200 step).
--validate reruns the model against every docs/results/live_loop/async_vs_sync_*.json run (--config: the recipe
those runs used); --paper predicts the paper's regime (--config: its 8B recipe).
Exit status: 0; 1 with one line for a bad flag, an unknown topology or missing measurements.
"""

import json
import os

from absl import app, flags

from jaxwebrl import cli
from jaxwebrl.plan import paper, planning, validation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOPOLOGY = flags.DEFINE_string("topology", "cpu", "cpu, a TPU slice with an AOT report (v5p-8), or h200x8")
_REGIME = flags.DEFINE_enum("regime", "web", ["local", "web"], "env latency regime (env/latency.py)")
_BROWSERS = flags.DEFINE_integer("browsers", None, "browsers (rollout workers); default: the recipe's num_workers")
_SERVER = flags.DEFINE_enum("server", "shared", list(planning.SERVER_PLACEMENTS),
                            "accelerator topologies: the policy server's chip, shared with the trainer, reserved "
                            "from it, or separate")
_SLICES = flags.DEFINE_float("trainer_slices", 1.0, "accelerator topologies: data-parallel copies of the slice")
_SUCCESS = flags.DEFINE_float("success_rate", planning.Workload.success_p, "accelerator topologies: assumed success")
_RESPONSE = flags.DEFINE_integer("response_tokens", planning.Workload.response_tokens,
                                 "accelerator topologies: assumed tokens a response")
_RESULTS = flags.DEFINE_string("results_dir", os.path.join(REPO, "docs", "results"), "the measured JSON")
_SEED = flags.DEFINE_integer("seed", 0, "the model's random seed (its output is deterministic for a seed)")
_UPDATES = flags.DEFINE_integer("updates", 20, "train steps simulated per setting")
_VALIDATE = flags.DEFINE_bool("validate", False, "the model against every measured async/sync run")
_PAPER = flags.DEFINE_bool("paper", False, "the paper's regime (64 browsers, 8B, v5p-8 and 8 H200s)")
_OUT = flags.DEFINE_string("out", None, "also write the JSON to this file")


def main(argv):
    del argv
    config = cli.CONFIG.value   # not cli.loaded_config(): that enables JAX's compilation cache, and no JAX runs here
    workload = planning.Workload(success_p=_SUCCESS.value, response_tokens=_RESPONSE.value)
    try:
        if _VALIDATE.value:
            report = validation.validate(_RESULTS.value, config.copy_and_resolve_references, seed=_SEED.value)
        elif _PAPER.value:
            report = paper.paper_regime(config, results_dir=_RESULTS.value, seed=_SEED.value, workload=workload)
        else:
            if _BROWSERS.value is not None:
                if _BROWSERS.value < 1:
                    cli.exit_with(f"plan error: --browsers={_BROWSERS.value}: give at least 1")
            browsers = _BROWSERS.value or int(config.rollout.num_workers)
            report = planning.plan(config, results_dir=_RESULTS.value, topology=_TOPOLOGY.value,
                                   regime=_REGIME.value, browsers=browsers, seed=_SEED.value,
                                   updates=_UPDATES.value, workload=workload, server=_SERVER.value,
                                   trainer_slices=_SLICES.value)
    except (FileNotFoundError, ValueError, KeyError) as err:
        cli.exit_with(f"plan error: {err}")
    text = json.dumps(report, indent=1, sort_keys=True)
    if _OUT.value:
        os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
        with open(_OUT.value, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("config error"))
