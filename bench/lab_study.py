r"""The JAX lab study (issue 43): constT10 (1/k) against grpo (1/|τ|), then drgrpo and raftpp, at 50 paired seeds
x 200 updates, for failure/success length ratios 1, 2.5 and 4. Protocol, predictions and analysis were fixed in
docs/learning.md ("The JAX lab") before any run; `bench/lab_table.py` prints the verdicts from the records.

    nohup nice -n 19 python3 bench/lab_study.py > /tmp/lab_study.log 2>&1 &        # the study (resumable)
    python3 bench/lab_study.py --tiny --seeds=2 --updates=2 --ratios=1,2 --out=/tmp/lab   # smallest size

One JSON record per (ratio, arm), OUT/ratio<r>_<arm>.json, written atomically when that arm's seeds finish: the
experiment (every size and knob, the recipe's advantage config and loss), the command, the commit(s) and the code's git object ids, how many
times the run was resumed, CPU and wall seconds, and per measure (jaxwebrl.lab.run.CURVES) each seed's endpoints
(`first10`, `last50`: means over the first 10 and the last 50 updates; `all`) with their mean and 95% CI over
seeds, and the curve in blocks of 10 updates. A record whose experiment matches is skipped, so a killed study
resumes from the records written (and committed ones carry across machines); within a record, the state after
every chunk of updates is kept under --state_dir (NumPy .npz, no pickle) and a restart on the same machine
continues from it, counted in `resumed`. The study refuses to start, or to save, from a tree with uncommitted
changes to jaxwebrl/ or bench/ when --out is inside the repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from lab_table import interval
from provenance import require_clean_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxwebrl.lab import env as env_lib  # noqa: E402  (the repository root is on sys.path from here)
from jaxwebrl.lab import policy as policy_lib  # noqa: E402
from jaxwebrl.lab import recipes, run  # noqa: E402
from jaxwebrl.lab.update import Setup  # noqa: E402

PRIMARY_ARMS = ("constT10", "grpo")
BLOCK = 10
TINY = dict(env=dict(lengths=(2, 3), length_weights=(1.0, 1.0), n_buttons=2, n_clues=2, memory_symbols=2,
                     memory_slots=2),
            policy=dict(width=8, layers=1, heads=1, mlp=8), setup=dict(n_groups=2, group_size=2, warm_start_steps=2))


def git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


CODE = ("jaxwebrl/lab", "jaxwebrl/rl", "jaxwebrl/train/rl_config.py", "configs", "bench/lab_study.py")


def code_hashes() -> dict:
    """git object ids of the code a record depends on: content hashes, so they survive a rebase (a commit does not)."""
    return {path: git("rev-parse", f"HEAD:{path}") for path in CODE}


def make_setup(ratio: float, arm: str, args) -> Setup:
    tiny = TINY if args.tiny else dict(env={}, policy={}, setup={})
    env = env_lib.EnvConfig(failure_success_ratio=ratio, trap_prob=args.trap_prob, **tiny["env"])
    return Setup(env=env, policy=policy_lib.PolicyConfig(**tiny["policy"]),
                 recipe=recipes.lab_recipe(arm, gen_slots=env.gen_slots), lag=args.lag, **tiny["setup"])


def experiment(setup: Setup, ratio: float, arm: str, args) -> dict:
    """What makes two runs the same experiment (JSON-normalised)."""
    fields = {f.name: getattr(setup, f.name) for f in dataclasses.fields(setup) if f.name not in ("env", "policy", "recipe")}
    recipe = setup.recipe
    key = {"ratio": ratio, "arm": arm, "seeds": list(range(args.seeds)), "updates": args.updates,
           "env": dataclasses.asdict(setup.env), "horizons": setup.env.horizons,
           "policy": dataclasses.asdict(setup.policy), "setup": fields,
           "recipe": {"advantage": dataclasses.asdict(recipe.advantage), "loss": recipe.loss,
                      "loss_kwargs": [list(kv) for kv in recipe.loss_kwargs], "agg_mode": recipe.agg_mode}}
    return json.loads(json.dumps(key))


def summarise(curves: dict) -> tuple[dict, dict]:
    """(per_seed endpoints with their intervals, curve blocks) from {measure: [S, U]} arrays."""
    per_seed, blocks = {}, {}
    with np.errstate(all="ignore"):
        for name, values in curves.items():
            values = np.asarray(values, np.float64)
            ends = {"first10": np.nanmean(values[:, :10], 1), "last50": np.nanmean(values[:, -50:], 1),
                    "all": np.nanmean(values, 1)}
            per_seed[name] = {k: [None if np.isnan(x) else float(x) for x in v] for k, v in ends.items()}
            per_seed[name]["interval"] = {k: interval(per_seed[name][k]) for k in ends}
            means = [np.nanmean(values[:, i:i + BLOCK], 1) for i in range(0, values.shape[1], BLOCK)]
            blocks[name] = [interval([None if np.isnan(x) else x for x in m]) for m in means]
    return per_seed, blocks


class Partial:
    """A record's state between chunks: OUT_STATE/<record>.npz (the RunState's leaves) + .json (curves, meta)."""

    def __init__(self, state_dir: str, name: str):
        self.base = os.path.join(state_dir, name)

    def load(self, key: dict, template):
        if not os.path.isfile(self.base + ".json"):
            return None
        with open(self.base + ".json", encoding="utf-8") as f:
            meta = json.load(f)
        if meta["experiment"] != key:
            print(f"lab_study: {self.base}.json is another experiment: starting that record afresh", flush=True)
            return None
        with np.load(self.base + ".npz", allow_pickle=False) as data:
            leaves = [jnp.asarray(data[f"leaf{i}"]) for i in range(len(data.files))]
        state = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)
        return state, meta

    def save(self, state, meta: dict) -> None:
        os.makedirs(os.path.dirname(self.base), exist_ok=True)
        leaves = {f"leaf{i}": np.asarray(x) for i, x in enumerate(jax.tree_util.tree_leaves(state))}
        np.savez(self.base + ".tmp.npz", **leaves)
        os.replace(self.base + ".tmp.npz", self.base + ".npz")
        with open(self.base + ".json.tmp", "w", encoding="utf-8") as f:
            json.dump(meta, f)
        os.replace(self.base + ".json.tmp", self.base + ".json")

    def remove(self) -> None:
        for suffix in (".npz", ".json"):
            if os.path.exists(self.base + suffix):
                os.remove(self.base + suffix)


def run_record(ratio: float, arm: str, args, starts: dict) -> None:
    name = f"ratio{ratio:g}_{arm}"
    path = os.path.join(args.out, name + ".json")
    setup = make_setup(ratio, arm, args)
    key = experiment(setup, ratio, arm, args)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if json.load(f)["experiment"] == key:
                print(f"lab_study: {name} recorded, skipping", flush=True)
                return
        print(f"lab_study: {path} is another experiment: running it again", flush=True)
    seeds = jnp.arange(args.seeds)
    if ratio not in starts:     # the warm start is arm-free: one per ratio serves every arm
        starts[ratio] = run.init(setup, seeds)
    partial = Partial(args.state_dir, name)
    loaded = partial.load(key, starts[ratio])
    if loaded is None:
        state, meta = starts[ratio], {"experiment": key, "done": 0, "curves": {}, "resumed": 0, "commits": [],
                                       "cpu_s": 0.0, "wall_s": 0.0}
    else:
        state, meta = loaded
        meta["resumed"] += 1
        print(f"lab_study: {name} resumed at update {meta['done']} (resume {meta['resumed']})", flush=True)
    while meta["done"] < args.updates:
        commit = require_clean_tree("lab_study", "ran", args.out)
        if commit not in meta["commits"]:
            meta["commits"].append(commit)
        n = min(args.chunk, args.updates - meta["done"])
        cpu, wall = time.process_time(), time.time()
        state, curves = run.train(setup, state, seeds, meta["done"], n)
        curves = jax.device_get(curves)
        meta["cpu_s"] += time.process_time() - cpu
        meta["wall_s"] += time.time() - wall
        for k, v in curves.items():
            meta["curves"][k] = np.concatenate([np.asarray(meta["curves"].get(k, np.zeros((args.seeds, 0)))),
                                                np.asarray(v)], axis=1).tolist()
        meta["done"] += n
        partial.save(state, meta)
        print(f"lab_study: {name} update {meta['done']}/{args.updates}, success "
              f"{np.nanmean(np.asarray(curves['success'])):.3f}, {meta['wall_s']:.0f} s wall, "
              f"{meta['cpu_s']:.0f} s CPU", flush=True)
    per_seed, blocks = summarise(meta["curves"])
    record = {"experiment": key, "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
              "commit": require_clean_tree("lab_study", "ran", args.out), "commits": meta["commits"],
              "code": code_hashes(), "resumed": meta["resumed"],
              "cpu_s": meta["cpu_s"], "wall_s": meta["wall_s"], "machine": f"{platform.node()} "
              f"({os.cpu_count()} CPUs, nice {os.nice(0)}, load {os.getloadavg()[0]:.1f})",
              "block_updates": BLOCK, "per_seed": per_seed, "curves": blocks}
    os.makedirs(args.out, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    partial.remove()
    print(f"lab_study: {name} recorded in {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "lab"))
    parser.add_argument("--state_dir", default="/tmp/lab_study_state")
    parser.add_argument("--ratios", default="2.5,4,1", help="failure/success length ratios, in running order")
    parser.add_argument("--arms", default="constT10,grpo,drgrpo,raftpp",
                        help="arms (jaxwebrl/lab/recipes.py ARMS); constT10 and grpo run first at every ratio")
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--chunk", type=int, default=25, help="updates a compiled call (and a saved state)")
    parser.add_argument("--lag", type=int, default=0, help="simulated policy lag in updates (decoupled IS)")
    parser.add_argument("--trap_prob", type=float, default=0.0)
    parser.add_argument("--tiny", action="store_true", help="the smallest sizes (tests)")
    args = parser.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in recipes.ARMS]
    if unknown:
        raise SystemExit(f"lab_study: unknown arms {unknown}: use {sorted(recipes.ARMS)}")
    require_clean_tree("lab_study", "runs", args.out)
    order = [a for a in arms if a in PRIMARY_ARMS], [a for a in arms if a not in PRIMARY_ARMS]
    starts = {}
    for group in order:
        for ratio in ratios:
            for arm in group:
                run_record(ratio, arm, args, starts)


if __name__ == "__main__":
    main()
