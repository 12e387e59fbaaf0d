"""A noisy scripted player of the lab's environment, the demonstrations of the warm start (as the browser runs
start from supervised fine-tuning): it writes the clue's memory symbol and a few random filler symbols, then
the right action, except with probability `epsilon`, a uniformly random action."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxwebrl.lab import env as env_lib


def act(config: env_lib.EnvConfig, state: env_lib.EnvState, key, *, epsilon: float):
    """One demonstration step for a batch: (generated [E, G] int32, slot_kinds [E, G] int32), as policy.sample
    lays them out. Memory: the clue's symbol then 0 .. M - 1 random fillers (uniform), END unless M are written."""
    e, m = state.clue.shape[0], config.memory_slots
    k_fill, k_noise, k_random = jax.random.split(key, 3)
    n_fill = jax.random.randint(k_fill, (e,), 0, m)
    fillers = jax.random.randint(jax.random.fold_in(k_fill, 1), (e, m), 0, config.memory_symbols)
    slots = jnp.arange(m)[None]
    memory = jnp.where(slots == 0, state.clue[:, None], fillers) + config.memory0
    n_memory = n_fill + 1
    button = jnp.take_along_axis(state.hints, jnp.minimum(state.progress, config.max_horizon - 1)[:, None], 1)[:, 0]
    right = jnp.where(env_lib.ready(state), config.answer0 + state.clue, config.press0 + button)
    random_action = jax.random.randint(k_random, (e,), config.press0, config.vocab_size)
    action = jnp.where(jax.random.uniform(k_noise, (e,)) < epsilon, random_action, right)
    g = jnp.arange(config.gen_slots)[None]
    action_slot = n_memory[:, None] + 1
    generated = jnp.select([g < n_memory[:, None], g == n_memory[:, None], g == action_slot],
                           [jnp.pad(memory, ((0, 0), (0, 2))), env_lib.END, action[:, None]], env_lib.PAD)
    end_kind = jnp.where(n_memory[:, None] < m, env_lib.KIND_MEMORY, env_lib.KIND_END)
    kinds = jnp.select([g < n_memory[:, None], g == n_memory[:, None], g == action_slot],
                       [env_lib.KIND_MEMORY, end_kind, env_lib.KIND_ACTION], env_lib.KIND_NONE)
    return generated.astype(jnp.int32), kinds.astype(jnp.int32)
