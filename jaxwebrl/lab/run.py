"""A lab run: warm start, then `updates` RL updates, for many seeds at once (`vmap` over seeds, `lax.scan` over
updates: one program). Arms of one seed share the initial weights, the warm start and every environment draw:
all of them come from the seed's key alone (paired seeds).

    state = init(setup, seeds)                         # jnp.arange(50): warm-started params, one per seed
    state, curves = train(setup, state, seeds, first=0, updates=25)   # curves[name]: [S, 25] float32
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxwebrl.lab import oracle
from jaxwebrl.lab import policy as policy_lib
from jaxwebrl.lab import rollout as rollout_lib
from jaxwebrl.lab.update import Setup, rl_update, supervised_step

CURVES = ("success", "success_steps", "failure_steps", "failure_timeout_share", "memory_tokens",
          "failure_weight_share", "clip_ratio")


class RunState(NamedTuple):
    params: dict
    opt_state: tuple
    history: dict      # params of the last `lag` + 1 updates, oldest first (the rollouts' behaviour policy)


def _seed_key(seed, purpose: int):
    return jax.random.fold_in(jax.random.PRNGKey(seed), purpose)


def _oracle_chooser(setup: Setup):
    def choose(state, prompt, key):
        generated, kinds = oracle.act(setup.env, state, key, epsilon=setup.warm_start_epsilon)
        return generated, kinds, jnp.zeros(generated.shape, jnp.float32)
    return choose


def _init_one(setup: Setup, seed):
    params = policy_lib.init_params(setup.env, setup.policy, _seed_key(seed, 0))
    opt_state = setup.optimizer().init(params)

    def warm(carry, i):
        params, opt_state = carry
        rows = rollout_lib.play(setup.env, _oracle_chooser(setup), jax.random.fold_in(_seed_key(seed, 1), i),
                                n_groups=setup.n_groups, group_size=setup.group_size)
        params, opt_state, loss = supervised_step(setup, params, opt_state, rows)
        return (params, opt_state), loss

    (params, _), _ = jax.lax.scan(warm, (params, opt_state), jnp.arange(setup.warm_start_steps))
    history = jax.tree_util.tree_map(lambda x: jnp.stack([x] * (setup.lag + 1)), params)
    return RunState(params=params, opt_state=setup.optimizer().init(params), history=history)


def init(setup: Setup, seeds) -> RunState:
    """Warm-started state for seeds [S] int32 (the RL optimizer starts fresh). It does not depend on the arm
    (`setup.recipe`), so every arm of a seed starts from the same weights, compiled once."""
    return _init(dataclasses.replace(setup, recipe=None), seeds)


@functools.partial(jax.jit, static_argnums=0)
def _init(setup: Setup, seeds) -> RunState:
    return jax.vmap(functools.partial(_init_one, setup))(seeds)


def _mean_where(x, where):
    where = where.astype(jnp.float32)
    n = where.sum()
    return jnp.where(n > 0, (x * where).sum() / jnp.maximum(n, 1.0), jnp.nan)


def batch_curves(rows: rollout_lib.Rows) -> dict:
    """One update's training-batch measures (float32 scalars; NaN where there is nothing to average)."""
    steps = rows.steps.astype(jnp.float32)
    failed = ~rows.success
    return {"success": rows.success.mean(), "success_steps": _mean_where(steps, rows.success),
            "failure_steps": _mean_where(steps, failed),
            "failure_timeout_share": _mean_where(rows.timed_out, failed),
            "memory_tokens": _mean_where(rows.memory_len.astype(jnp.float32), rows.active)}


def _update_one(setup: Setup, seed, state: RunState, index):
    behaviour = jax.tree_util.tree_map(lambda x: x[0], state.history)
    rows = rollout_lib.play(setup.env, rollout_lib.policy_chooser(setup.env, setup.policy, behaviour),
                            jax.random.fold_in(_seed_key(seed, 2), index),
                            n_groups=setup.n_groups, group_size=setup.group_size)
    params, opt_state, stats = rl_update(setup, state.params, state.opt_state, rows)
    history = jax.tree_util.tree_map(lambda h, p: jnp.concatenate([h[1:], p[None]]), state.history, params)
    return RunState(params, opt_state, history), {**batch_curves(rows), **stats}


@functools.partial(jax.jit, static_argnums=(0, 4))
def train(setup: Setup, state: RunState, seeds, first, updates: int):
    """`updates` updates from update index `first` for every seed. Returns (state, {name: [S, updates]})."""
    def one_seed(seed, state):
        def body(state, index):
            return _update_one(setup, seed, state, index)
        return jax.lax.scan(body, state, first + jnp.arange(updates))
    return jax.vmap(one_seed)(seeds, state)
