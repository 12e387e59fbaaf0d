"""Play a batch of episodes to the end (one `lax.scan` over the longest horizon) and lay them out as the step
rows the rl/ library takes: one row per (episode, step), the steps past an episode's end being padding rows.

Padding rows carry no decision (loss_mask 0) and an episode and group id of their own with reward 0, so the
rl/ path counts them in no episode's |τ| and no group's statistics (a group of one is normalised to 0).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxwebrl.lab import env as env_lib
from jaxwebrl.lab import policy as policy_lib


class Rows(NamedTuple):
    """R = E * max_horizon step rows (episode-major) and the episodes' outcomes."""

    prompt: jnp.ndarray           # [R, P] int32
    generated: jnp.ndarray        # [R, G] int32
    slot_kinds: jnp.ndarray       # [R, G] int32
    behave_logprobs: jnp.ndarray  # [R, G] float32 (0 off the decisions; 0 everywhere for demonstrations)
    loss_mask: jnp.ndarray        # [R, G] bool decision slots of real steps
    active: jnp.ndarray           # [R] bool a real step (not padding)
    memory_len: jnp.ndarray       # [R] int32 memory tokens written at the step
    episode_ids: jnp.ndarray      # [R] int32
    group_ids: jnp.ndarray        # [R] int32
    rewards: jnp.ndarray          # [R] float32 the episode's reward (1 success, 0 failure) on its rows
    success: jnp.ndarray          # [E] bool
    steps: jnp.ndarray            # [E] int32 episode length |τ|
    timed_out: jnp.ndarray        # [E] bool ended by the horizon, not by an answer or a trap
    horizon: jnp.ndarray          # [E] int32 the episode's horizon H


def play(config: env_lib.EnvConfig, choose: Callable, key, *, n_groups: int, group_size: int) -> Rows:
    """choose(state, prompt [E, P], key) -> (generated, slot_kinds, logprobs) plays every step."""
    k_reset, k_play = jax.random.split(key)
    state = env_lib.reset(config, k_reset, n_groups, group_size)

    def one_step(state, t):
        k_choose, k_env = jax.random.split(jax.random.fold_in(k_play, t))
        prompt = env_lib.observe(config, state)
        generated, kinds, logprobs = choose(state, prompt, k_choose)
        _, memory_len, _ = env_lib.parse(config, generated, kinds)
        new_state, active = env_lib.step(config, state, generated, kinds, k_env)
        return new_state, (prompt, generated, kinds, logprobs, active, memory_len)

    final, per_step = jax.lax.scan(one_step, state, jnp.arange(config.max_horizon))
    prompt, generated, kinds, logprobs, active, memory_len = (
        jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:]) for x in per_step)   # [H, E, ...] -> [E * H, ...]
    e, h = n_groups * group_size, config.max_horizon
    episode = jnp.repeat(jnp.arange(e, dtype=jnp.int32), h)
    padding_id = jnp.arange(e * h, dtype=jnp.int32) + e          # unique and disjoint from real ids
    reward = final.success.astype(jnp.float32)[episode]
    return Rows(prompt=prompt, generated=generated, slot_kinds=kinds, behave_logprobs=logprobs,
                loss_mask=policy_lib.decision_mask(kinds) & active[:, None], active=active,
                memory_len=jnp.where(active, memory_len, 0),
                episode_ids=jnp.where(active, episode, padding_id),
                group_ids=jnp.where(active, episode // group_size, padding_id),
                rewards=jnp.where(active, reward, 0.0), success=final.success, steps=final.t,
                timed_out=final.timed_out, horizon=final.horizon)


def policy_chooser(env_config, policy_config, params):
    """`choose` for `play` that samples from the policy."""
    def choose(state, prompt, key):
        return policy_lib.sample(env_config, policy_config, params, prompt, key)
    return choose
