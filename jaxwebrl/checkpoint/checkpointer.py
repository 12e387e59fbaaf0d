"""Orbax checkpoints of a training run: params, optimizer state, RNG and a JSON record of progress.

Layout (`layout.py`): `WORKDIR/checkpoints/<step>/{state, meta, digests}`. `state` is a pytree (params, opt_state,
rng key data); `meta` is JSON: step, policy version, buffer cursor and whatever the trainer needs to continue exactly
where it stopped (no pickle); `digests` is JSON: each leaf's digest (`digests.py`; Orbax checksums no array data),
reduced on the devices over every shard of every process, and the meta's, written with the step (Orbax commits a
step's items together) by process 0. Retention
keeps the last `keep` steps plus the best one by `best_metric`; saves are asynchronous (the trainer keeps training
while the previous step is written).

Failures are one line (`CheckpointError`) and never cost an older checkpoint:
- resume restores the newest checkpoint that reads back and matches its digests; a newer unreadable one is moved to
  `checkpoints/unreadable/<step>` (kept for a post-mortem) with a log line naming it;
- a save that cannot be written (disk full, read-only) names its step: refused before writing when the disk
  has less room than the previous checkpoint took, or reported by `check()` (called every train step) once the
  background write failed; its temporary directory is removed and the previous checkpoint stays intact.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import traceback
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from jaxwebrl.checkpoint.digests import leaf_digests, meta_digest
from jaxwebrl.checkpoint.layout import ITEMS, check_restored, digest_items, state_tree
from jaxwebrl.errors import CheckpointError, one_line

log = logging.getLogger(__name__)

UNREADABLE_DIR = "unreadable"
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class _QuietOrbaxErrors(logging.Filter):
    """Orbax logs a failed background save from every writer thread with a traceback; the Checkpointer reports
    it once, as one line (CheckpointError), so those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname)


_QUIET = _QuietOrbaxErrors()


def _quiet_closed_loop_callbacks(previous):
    """sys.unraisablehook that drops one known echo of a failed save: after Orbax's save thread closed its asyncio
    loop on the error, the TensorStore writes still in flight complete and their callbacks hit the closed loop
    ("Event loop is closed", only asyncio frames). Everything else goes to `previous`."""

    def hook(unraisable):
        exc = unraisable.exc_value
        frames = traceback.extract_tb(exc.__traceback__) if exc is not None else []
        if (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed" and frames
                and all(f"asyncio{os.sep}" in frame.filename for frame in frames)):
            return
        previous(unraisable)

    hook.quiet_closed_loop = True
    return hook


class Checkpointer:
    """Save and restore `(params, opt_state, rng, meta)` under one directory, keyed by train step."""

    def __init__(self, directory: str, *, keep: int = 3, keep_best: bool = True,
                 best_metric: str = "rollout/reward", best_mode: str = "max", async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.best_metric = best_metric
        self._options = {"keep": keep, "keep_best": keep_best, "best_mode": best_mode, "async_save": async_save}
        logging.getLogger("absl").addFilter(_QUIET)
        if not getattr(sys.unraisablehook, "quiet_closed_loop", False):
            sys.unraisablehook = _quiet_closed_loop_callbacks(sys.unraisablehook)
        self._manager = self._open_manager()
        self._saving: int | None = None      # step of a save that may still be in flight
        self._failure_reported = False       # a CheckpointError was raised: closing must not raise it again

    def _open_manager(self) -> ocp.CheckpointManager:
        o = self._options
        policies = [checkpoint_managers.LatestN(n=o["keep"])]
        if o["keep_best"]:
            policies.append(checkpoint_managers.BestN(
                get_metric_fn=lambda metrics: float(metrics[self.best_metric]), reverse=o["best_mode"] == "min",
                n=1, keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
            enable_async_checkpointing=o["async_save"], create=True)
        return ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    # ------------------------------------------------------------------ save
    def save(self, step: int, *, params, opt_state, rng: jax.Array, meta: dict[str, Any],
             metrics: dict[str, float] | None = None, critic=None) -> None:
        """Start saving step `step` (returns before the write finishes when async); `meta` must be JSON-able;
        `critic`: the value model's state (critic PPO) or None. Raises CheckpointError when this save, or the
        previous one, cannot be written."""
        if self._saving is not None:
            self.wait()   # the save in flight must be whole before its size says how much room this one needs
        self._refuse_without_room(step)
        state = state_tree(params, opt_state, rng, critic)
        best = None
        if metrics is not None and self.best_metric in metrics and np.isfinite(metrics[self.best_metric]):
            best = {self.best_metric: float(metrics[self.best_metric])}
        digests = leaf_digests(state)   # on every process (a reduction over all their devices), before any donation
        meta = {**meta, "step": int(step)}
        digests["meta"] = meta_digest(meta)
        self._saving = int(step)
        try:
            self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta),
                digests=ocp.args.JsonSave(digests)), metrics=best, force=True)
        except Exception as err:  # noqa: BLE001 - any write failure becomes one CheckpointError line
            raise self._failed(step, err) from None
        if not self._options["async_save"]:
            self._saving = None

    def check(self) -> None:
        """Raises CheckpointError (naming its step) when the last asynchronous save has failed; else returns."""
        if self._saving is None or self._manager.is_saving_in_progress():
            return
        self.wait()

    def wait(self) -> None:
        """Block until pending asynchronous saves are durable; CheckpointError when one failed."""
        try:
            self._manager.wait_until_finished()
        except Exception as err:  # noqa: BLE001
            raise self._failed(self._saving, err) from None
        self._saving = None

    def _refuse_without_room(self, step: int) -> None:
        """CheckpointError before writing when the disk has less free space than the newest checkpoint takes."""
        latest = self.latest_step()
        if latest is None:
            return
        needed = _tree_bytes(os.path.join(self.directory, str(latest)))
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            raise CheckpointError(
                f"checkpoint of step {step} not written: {free / 2**20:.2f} MiB free under {self.directory}, the "
                f"checkpoint of step {latest} took {needed / 2**20:.2f} MiB; it is intact: free space and rerun the "
                f"same command to resume from step {latest}")

    def _failed(self, step: int | None, err: BaseException) -> CheckpointError:
        """The one-line error of a failed save of `step`; removes its temporary directory (it holds no data)."""
        for name in os.listdir(self.directory) if os.path.isdir(self.directory) else ():
            if name.endswith(TMP_SUFFIX):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self._saving = None
        self._failure_reported = True
        text = str(err)
        if "No space left" in text or "RESOURCE_EXHAUSTED" in text or "ENOSPC" in text:
            why = "the disk is full"
        elif "Read-only" in text or "PERMISSION_DENIED" in text or "Permission denied" in text:
            why = "the directory is not writable"
        else:
            why = one_line(err)
        intact = [s for s in self.all_steps() if step is None or s < step]
        resume = (f"the checkpoint of step {intact[-1]} is intact: fix that and rerun the same command to resume "
                  f"from it") if intact else "no earlier checkpoint exists: fix that and rerun to start again"
        return CheckpointError(f"checkpoint of step {step} could not be written under {self.directory} ({why}); "
                               f"{resume}")

    # ------------------------------------------------------------------ restore
    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(self, *, params, opt_state, rng: jax.Array, step: int | None = None, critic=None):
        """Restore step `step` (default: latest) into the structure, dtypes and shardings of the given pytrees.

        Returns `(params, opt_state, rng, meta)`, and the critic's state fifth when a `critic` template is given;
        `rng` comes back as a typed key like the one passed in. DigestMismatch (naming the leaf) when an array
        differs from what was saved (a step saved with digests; one saved before they existed is not checked).
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}: nothing to restore")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state_tree(params, opt_state, rng, critic))
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore(),
            **digest_items(os.path.join(self.directory, str(step)))))
        check_restored(out)
        state = out["state"]
        restored_rng = jax.random.wrap_key_data(state["rng"], impl=jax.random.key_impl(rng))
        restored = (state["params"], state["opt_state"], restored_rng, dict(out["meta"]))
        return restored if critic is None else (*restored, state["critic"])

    def restore_newest_readable(self, *, params, opt_state, rng: jax.Array, required_meta=(),
                                set_aside: bool = True, critic=None):
        """`restore` of the newest checkpoint that reads back whole (meta holding `required_meta`, the `critic` when
        its template is given), or None when there is no checkpoint. Newer unreadable ones are skipped with one log
        line each and, once an older one restored (so the config does fit), moved to `unreadable/<step>` when
        `set_aside`. CheckpointError (one line, nothing moved) when none restores."""
        broken: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            try:
                out = self.restore(params=params, opt_state=opt_state, rng=rng, step=step, critic=critic)
                missing = [k for k in required_meta if k not in out[3]]
                if missing:
                    raise KeyError(f"its meta lacks {missing}")
            except Exception as err:  # noqa: BLE001 - any failure to read it back makes it unusable
                broken.append((step, one_line(err, 160)))
                log.warning("checkpoint of step %d under %s is unreadable (%s); trying the one before",
                            step, self.directory, broken[-1][1])
                continue
            if broken and set_aside:
                self._set_aside([s for s, _ in broken])
            return out
        if broken:
            details = "; ".join(f"step {s}: {why}" for s, why in broken)
            raise CheckpointError(f"no checkpoint under {self.directory} can be restored ({details}); if the config "
                                  f"changed (model, optimizer) use a new --workdir, else move the broken ones away")
        return None

    def _set_aside(self, steps: list[int]) -> None:
        aside = os.path.join(self.directory, UNREADABLE_DIR)
        os.makedirs(aside, mode=0o700, exist_ok=True)
        for step in steps:
            target = os.path.join(aside, str(step))
            if os.path.exists(target):
                target += f".{int(time.time())}"
            os.replace(os.path.join(self.directory, str(step)), target)
            log.warning("moved the unreadable checkpoint of step %d to %s", step, target)
        self._manager.close()
        self._manager = self._open_manager()

    def close(self) -> None:
        """Waits for pending saves (CheckpointError when one failed and was not reported before) and releases the
        manager."""
        reported = self._failure_reported   # _failed() marks the error it makes; this wait may be the first to see it
        try:
            self.wait()
        except CheckpointError:
            if not reported:
                raise
        finally:
            try:
                self._manager.close()
            except Exception:  # noqa: BLE001 - after a reported failure Orbax may re-raise it while closing
                if not self._failure_reported:
                    raise


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total
