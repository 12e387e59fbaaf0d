"""Critic PPO's value model in a train step: its state, its values for the step rows, its clipped value updates.

A separate critic, not a head on the policy's own trunk (`models/value_head.py`: a linear head on a copy of the
trunk, zero-initialised): AReaL and AsyncWebRL train their critic apart, and so does this, because a shared trunk
couples the two losses (the value loss's gradient moves the policy the rollout workers sample from, and the policy
server, the export and LoRA would all carry a value head). The price is a second trunk, its gradients and its AdamW
moments in device memory during the update: about twice the trainer's weights and optimizer state.

In a train step (`update.Updater`, when given a `ValueModel`):
  1. `values` of every minibatch under the critic's current params, before any update: V [R, T] feeds GAE (the
     advantage path, `rl.advantages`) and is the anchor v_old of the value clip;
  2. after each minibatch's actor update, one AdamW step of the critic on the same rows: `rl.value_loss`'s clipped
     squared error against the GAE returns, over the tokens GAE reads the critic at (every policy token; the first
     token of each turn with `gae_timestep_unit="turn"`), times `value_loss_coef`.
A critic step whose loss or gradient is not finite changes nothing (in jit: no host copy) and is counted in
`critic/skipped_ratio`. The state (`CriticState`: params and optimizer state) is saved in the same training
checkpoint as the policy (`checkpoint/layout.py`) and restored with it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwebrl.models import value_head
from jaxwebrl.parallel import partition
from jaxwebrl.rl import gae as gae_lib
from jaxwebrl.rl import value_loss
from jaxwebrl.train.update import Minibatch, OptimizerConfig, make_optimizer


class CriticState(NamedTuple):
    """The value model's train state: params {"trunk", "value_head"} and their optimizer state (a pytree)."""

    params: dict
    opt_state: object


@dataclasses.dataclass(frozen=True)
class CriticSettings:
    """Static knobs of the critic's update (hashable)."""

    value_eps_clip: float | None = 0.2    # AReaL's value_eps_clip (None: no clip)
    value_loss_coef: float = 1.0
    turn_unit: bool = False               # GAE reads V at each turn's first token only (gae_timestep_unit "turn")

    def __post_init__(self):
        value_loss.check_value_clip(self.value_eps_clip)
        if not self.value_loss_coef > 0:
            raise ValueError(f"value_loss_coef={self.value_loss_coef!r}: must be > 0 (e.g. 1.0)")


def _forward_values(module, params, mb: Minibatch, grid):
    """V [R, T] float32 of minibatch `mb` under critic `params` (`value_head.token_values`)."""
    hidden, _ = module.apply({"params": params["trunk"]}, mb.input_ids, attention_mask=mb.attention_mask,
                             pixel_values=mb.pixel_values, image_index=mb.image_index,
                             image_grid_thw=None if grid is None else np.asarray(grid, np.int64), head="none")
    return value_head.token_values(hidden, params["value_head"])


@functools.lru_cache(maxsize=None)
def _compiled(module, settings: CriticSettings, optimizer_config: OptimizerConfig):
    """(values_fn, step_fn) jitted once per (module, settings, optimizer)."""
    optimizer, _ = make_optimizer(optimizer_config)

    def values_fn(params, mb: Minibatch, grid):
        return _forward_values(module, params, mb, grid)

    def step_fn(state: CriticState, mb: Minibatch, returns, old_values, value_mask, grid):
        def objective(p):
            values = _forward_values(module, p, mb, grid)
            loss, stats = value_loss.clipped_value_loss(values, old_values, returns, value_mask,
                                                        value_eps_clip=settings.value_eps_clip)
            return settings.value_loss_coef * loss, stats

        (loss, stats), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)   # a non-finite step leaves the critic as it was
        new = jax.tree.map(lambda n, o: jnp.where(ok, n, o), (params, opt_state), (state.params, state.opt_state))
        new = partition.constrain_state(new, "value_head")   # on a mesh: the layout it came in (as init_state)
        out = {f"critic/{k}": jnp.asarray(v, jnp.float32) for k, v in stats.items()}
        out.update({"critic/grad_norm": grad_norm, "critic/skipped_ratio": (~ok).astype(jnp.float32)})
        return CriticState(*new), out

    return (jax.jit(values_fn, static_argnames=("grid",)),
            jax.jit(step_fn, static_argnames=("grid",), donate_argnums=(0,)))


class ValueModel:
    """The critic of a run: `state` (a CriticState, set by `init_state` or a checkpoint restore), `values` and
    `update` on the Updater's minibatches."""

    def __init__(self, module, model_config, settings: CriticSettings, optimizer_config: OptimizerConfig):
        self.module = module
        self.model_config = model_config
        self.settings = settings
        self.optimizer, self.lr_fn = make_optimizer(optimizer_config)
        self._values, self._step = _compiled(module, settings, optimizer_config)
        self.state: CriticState | None = None

    def init_state(self, policy_params) -> CriticState:
        """A fresh critic on a copy of `policy_params`' trunk (the warm start's), zero head, fresh optimizer."""
        params = value_head.value_model_params(policy_params, self.model_config)
        return CriticState(params, partition.init_state(self.optimizer.init, params, "value_head"))

    def batch_values(self, splits, shape) -> tuple[jax.Array, list]:
        """(V [B, T] float32 of the batch's rows, scattered from `splits` (update.Split: rows, minibatch, grid; rows
        of no split get 0), [V of each split's rows]) under the current critic, before any update."""
        per_split = [self._values(self.state.params, m.minibatch, m.grid) for m in splits]
        values = jnp.zeros(shape, jnp.float32)
        for m, v in zip(splits, per_split):
            values = values.at[jnp.asarray(m.rows)].set(v)
        return values, per_split

    def value_mask(self, loss_mask: np.ndarray) -> np.ndarray:
        """[R, T] int32: the tokens GAE reads V at, the value loss's tokens (every policy token, or each turn's first
        token in turn units)."""
        if self.settings.turn_unit:
            return np.asarray(gae_lib.turn_starts(loss_mask), np.int32)
        return (np.asarray(loss_mask) > 0).astype(np.int32)

    def update(self, mb: Minibatch, grid, returns, old_values, value_mask) -> dict:
        """One clipped value-loss AdamW step on `mb`'s rows (returns / old_values / value_mask [R, T]); updates
        `state` (donated) and returns its device stats (`critic/*`)."""
        self.state, stats = self._step(self.state, mb, returns, old_values, value_mask, grid)
        return stats
