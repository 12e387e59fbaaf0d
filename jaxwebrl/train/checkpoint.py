"""Orbax checkpoints of a training run: params, optimizer state, RNG and a JSON record of progress.

Layout: `WORKDIR/checkpoints/<step>/{state, meta}`. `state` is a pytree (params, opt_state, rng key data);
`meta` is JSON: step, policy version, buffer cursor and whatever the trainer needs to continue exactly where
it stopped (no pickle). Retention keeps the last `keep` steps plus the best one by `best_metric`; saves are
asynchronous (the trainer keeps training while the previous step is written).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers


class Checkpointer:
    """Save and restore `(params, opt_state, rng, meta)` under one directory, keyed by train step."""

    def __init__(self, directory: str, *, keep: int = 3, keep_best: bool = True,
                 best_metric: str = "rollout/reward", best_mode: str = "max", async_save: bool = True):
        self.directory = os.path.abspath(directory)
        self.best_metric = best_metric
        policies = [checkpoint_managers.LatestN(n=keep)]
        if keep_best:
            policies.append(checkpoint_managers.BestN(
                get_metric_fn=lambda metrics: float(metrics[best_metric]), reverse=best_mode == "min", n=1,
                keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_save, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def save(self, step: int, *, params, opt_state, rng: jax.Array, meta: dict[str, Any],
             metrics: dict[str, float] | None = None) -> None:
        """Start saving step `step` (returns before the write finishes when async); `meta` must be JSON-able."""
        state = {"params": params, "opt_state": opt_state, "rng": jax.random.key_data(rng)}
        best = None
        if metrics is not None and self.best_metric in metrics and np.isfinite(metrics[self.best_metric]):
            best = {self.best_metric: float(metrics[self.best_metric])}
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({**meta, "step": int(step)})),
            metrics=best, force=True)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(self, *, params, opt_state, rng: jax.Array, step: int | None = None):
        """Restore step `step` (default: latest) into the structure, dtypes and shardings of the given pytrees.

        Returns `(params, opt_state, rng, meta)`; `rng` comes back as a typed key like the one passed in.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}: nothing to restore")
        target = {"params": params, "opt_state": opt_state, "rng": jax.random.key_data(rng)}
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        state = out["state"]
        restored_rng = jax.random.wrap_key_data(state["rng"], impl=jax.random.key_impl(rng))
        return state["params"], state["opt_state"], restored_rng, dict(out["meta"])

    def wait(self) -> None:
        """Block until pending asynchronous saves are durable."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
