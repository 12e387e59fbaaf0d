"""The power study's runs outliving the machine: each finished run as a small JSON record, and each unfinished run's
newest checkpoint beside it, both meant to be committed (bench/ablation.py --record, with --resume to take them).

    records = RunRecords("docs/results/paper_regime/power2/runs", sft, ["constT10", "grpo"], args)
    records.load("grpo", 4)                     # the finished run's result, or None
    restore = records.carried_start("grpo", 4, workdir)   # an unfinished run's checkpoint, copied into workdir
    with records.carrying("grpo", 4, workdir):  # while it trains: its newest checkpoint as RECORD/grpo/seed4.unfinished
        ...
    records.save("grpo", 4, result)             # finished: the record, and the unfinished copy is dropped

A record and an unfinished copy are keyed by what makes two runs the same experiment: the warm start's params digest,
--steps, --variant, the overrides and the held-out instances; one of another experiment is not used, with a line
saying why. An unfinished copy holds the newest checkpoint the run had saved (params, optimizer state, RNG, step,
policy version: ~2.5 MB for the long variant's policy), its metrics up to that step and its starts. A fresh machine
goes on from it through `checkpoint.restore_from` (jaxwebrl/checkpoint/resume.py, step 2): the same weights,
optimizer and step, with a fresh data stream (the episodes collected but not yet trained stayed in the old
machine's buffer), and the start counts as a resume in the run's `starts`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import shutil
import sys
import threading

from jaxwebrl.errors import WorkdirError
from jaxwebrl.plan.validation import apply_overrides
from jaxwebrl.train.metrics import read_jsonl

from learning_run import ROOT
from provenance import require_clean_tree
from seed_stats import run_dynamics

CARRY_EVERY_S = 60.0   # how often a training run's newest checkpoint is looked for (one is saved every update)
CARRIED = "carried"    # in a run's workdir: the unfinished copy it went on from (its restore_from)


class RunRecords:
    """Finished runs as DIR/<recipe>/seed<s>.json and unfinished ones as DIR/<recipe>/seed<s>.unfinished/ (module
    docstring). Records inside the checkout are refused, before any run and at every save, while jaxwebrl/ or bench/
    have uncommitted changes (a record names the commit its run was trained at)."""

    def __init__(self, root: str, sft: str, recipes: list[str], args, repo: str = ROOT):
        self.root, self.repo = os.path.abspath(root), repo
        self.commit()
        self.key = {"warm_start_sha256": warm_start_digest(sft, recipes[0], args), "steps": args.steps,
                    "variant": args.variant, "overrides": list(args.override), "eval_seeds": args.eval_seeds}

    def path(self, recipe: str, seed: int | None) -> str:
        return os.path.join(self.root, recipe, f"seed{'' if seed is None else seed}.json")

    def unfinished(self, recipe: str, seed: int | None) -> str:
        """The unfinished copy's directory (it may not exist)."""
        return self.path(recipe, seed)[:-len(".json")] + ".unfinished"

    def _differs(self, record: dict, path: str, what: str) -> bool:
        """True (with a line saying why) when `record` is of another experiment."""
        differ = sorted(k for k, v in self.key.items() if record.get(k) != v)
        if differ:
            print(f"ablation: {path} is another experiment ({', '.join(differ)} differ): {what}", file=sys.stderr,
                  flush=True)
        return bool(differ)

    def load(self, recipe: str, seed: int | None) -> dict | None:
        """The recorded run, or None (with a line saying why, when a record exists but is of another experiment)."""
        path = self.path(recipe, seed)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if self._differs(record, path, "training that run again"):
            return None
        print(f"ablation: {recipe} seed {seed} from its record {path} (commit {record.get('commit')})",
              file=sys.stderr, flush=True)
        return with_dynamics(record["run"])

    def commit(self) -> str:
        """The checkout's commit; SystemExit when the records are inside it and its code has uncommitted changes."""
        return require_clean_tree("ablation", "was trained at", self.root, self.repo)

    def save(self, recipe: str, seed: int | None, run_result: dict) -> None:
        """Write the record atomically (a killed bench leaves the old one or none, never half a file); the run's
        unfinished copy, if any, goes."""
        path = self.path(recipe, seed)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        record = {**self.key, "commit": self.commit(), "run": run_result}
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        os.replace(path + ".tmp", path)
        for suffix in ("", ".old", ".staging"):   # the copy, and what a killed copy left
            shutil.rmtree(self.unfinished(recipe, seed) + suffix, ignore_errors=True)

    def keep_unfinished(self, recipe: str, seed: int | None, workdir: str) -> int | None:
        """Copy the run's newest checkpoint whose metrics are logged, its metrics up to that step and its starts to
        the unfinished copy, unless the copy already holds that step. The copy is swapped in whole (a killed bench
        leaves the old copy or the new one). Returns the step the copy holds (None: the run has saved none yet)."""
        logged = max((record["step"] for _, record in metric_lines(workdir)), default=0)
        steps = [s for s in checkpoint_steps(os.path.join(workdir, "checkpoints")) if s <= logged]
        target = self.unfinished(recipe, seed)
        held = carried_step(target)
        if not steps or (held is not None and held >= steps[-1]):
            return held
        step, staging = steps[-1], target + ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(os.path.join(workdir, "checkpoints", str(step)),
                        os.path.join(staging, "checkpoints", str(step)))
        copy_progress(workdir, staging, step)
        with open(os.path.join(staging, "carried.json"), "w", encoding="utf-8") as f:
            json.dump({**self.key, "commit": self.commit(), "step": step}, f, indent=1)
        if os.path.isdir(target):
            shutil.rmtree(target + ".old", ignore_errors=True)
            os.replace(target, target + ".old")
        os.replace(staging, target)
        shutil.rmtree(target + ".old", ignore_errors=True)
        return step

    @contextlib.contextmanager
    def carrying(self, recipe: str, seed: int | None, workdir: str, every_s: float = CARRY_EVERY_S):
        """While the body trains the run: its newest checkpoint kept as the unfinished copy every `every_s` seconds
        (a thread; a copy that fails, say a checkpoint pruned while it was read, is tried again next time)."""
        stop = threading.Event()

        def keep():
            while not stop.wait(every_s):
                try:
                    self.keep_unfinished(recipe, seed, workdir)
                except (OSError, WorkdirError, SystemExit) as err:   # SystemExit: the checkout's code changed
                    print(f"ablation: {recipe} seed {seed}: its unfinished copy not kept this time ({err})",
                          file=sys.stderr, flush=True)

        thread = threading.Thread(target=keep, name="carry", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def carried_start(self, recipe: str, seed: int | None, workdir: str) -> str | None:
        """The checkpoints dir the run's training goes on from (its `checkpoint.restore_from`), or None: a workdir
        that went on from a copy before keeps it (its own checkpoints come first, the same config goes with them); a
        workdir without updates takes the unfinished copy, if it is of this experiment (its checkpoint into
        WORKDIR/carried/, its metrics and starts into the workdir)."""
        restore = os.path.join(os.path.abspath(workdir), CARRIED, "checkpoints")
        if os.path.isdir(restore):
            return restore
        if any(os.path.isfile(os.path.join(workdir, name)) for name in ("metrics.jsonl", "config.json")):
            return None   # a run of its own was started here
        source = next((d for d in (self.unfinished(recipe, seed), self.unfinished(recipe, seed) + ".old")
                       if carried_step(d) is not None), None)
        if source is None:
            return None
        with open(os.path.join(source, "carried.json"), encoding="utf-8") as f:
            carried = json.load(f)
        if self._differs(carried, source, "training that run from its start"):
            return None
        os.makedirs(workdir, exist_ok=True)
        shutil.copytree(os.path.join(source, "checkpoints"), restore)
        copy_progress(source, workdir, carried["step"])
        print(f"ablation: {recipe} seed {seed} goes on from its unfinished copy {source} at update {carried['step']} "
              f"(commit {carried['commit']})", file=sys.stderr, flush=True)
        return restore


STARTS = "starts.json"   # in a run's workdir: every start of its training, {"commit", "from_update", "browser", "cpu"}


def checkpoint_steps(folder: str) -> list[int]:
    """The steps of the checkpoints saved in `folder` (a Checkpointer's directory), oldest first: its numbered
    directories (a checkpoint being written has another name until it is complete)."""
    if not os.path.isdir(folder):
        return []
    return sorted(int(name) for name in os.listdir(folder)
                  if name.isdigit() and os.path.isdir(os.path.join(folder, name)))


def carried_step(folder: str) -> int | None:
    """The step an unfinished copy holds, or None where there is no complete copy."""
    if not os.path.isfile(os.path.join(folder, "carried.json")):
        return None
    with open(os.path.join(folder, "carried.json"), encoding="utf-8") as f:
        return int(json.load(f)["step"])


def metric_lines(workdir: str) -> list[tuple[str, dict]]:
    """(line, record) of WORKDIR/metrics.jsonl's complete records (`metrics.read_jsonl`; [] where there is none)."""
    path = os.path.join(workdir, "metrics.jsonl")
    return read_jsonl(path) if os.path.isfile(path) else []


def copy_progress(source: str, target: str, step: int) -> None:
    """SOURCE's metrics records up to train step `step` (the curve a checkpoint at `step` goes on from) and its
    starts, into TARGET."""
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(line for line, record in metric_lines(source) if record["step"] <= step)
    if os.path.isfile(os.path.join(source, STARTS)):
        shutil.copy(os.path.join(source, STARTS), os.path.join(target, STARTS))


def with_dynamics(run_result: dict) -> dict:
    """A recorded run with its dynamics derived from its curve by today's code (`seed_stats.run_dynamics`)."""
    return {**run_result, "dynamics": run_dynamics(run_result["curve"])}


def warm_start_digest(sft: str, recipe: str, args) -> str:
    """sha256 over the warm start's params (every leaf's path, dtype, shape and bytes, in path order): two SFT
    runs that produced the same weights give the same digest, wherever and however they were saved."""
    import jax   # deferred heavy dependency: only --record loads the warm start
    import numpy as np

    from jaxwebrl.checkpoint.policies import load_policy   # (the same: it imports the model code)

    config = apply_overrides(importlib.import_module(f"configs.{recipe}").get_config(args.variant), args.override)
    try:
        policy, _ = load_policy(config, sft)
    except FileNotFoundError as err:
        raise SystemExit(f"ablation: --record keys its records by the warm start's params, and {err}") from None
    digest = hashlib.sha256()
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(policy.params)[0],
                             key=lambda item: jax.tree_util.keystr(item[0])):
        value = np.asarray(leaf)
        digest.update(f"{jax.tree_util.keystr(path)}|{value.dtype}|{value.shape}|".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()
