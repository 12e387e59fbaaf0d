"""The lab's multi-turn environment family: pure functions of arrays (PureJaxRL style), jittable and vmappable.

An episode of success length L (drawn from `lengths`): a clue c in [0, n_clues) is shown in the FIRST observation
only; then L - 1 presses, each of the button the observation hints (a wrong press wastes the step, and with
`trap_prob` ends the episode); then, when the hint says ANSWER, the answer action for c, which ends the episode,
a success iff the answer is c. An answer at any other time ends it as a failure; so does reaching the horizon
H = round(failure_success_ratio * L). So a success takes L steps and the longest failure is
`failure_success_ratio` times as long (ratio 4 with L in 3/5/7: horizons 12/20/28, the mix around k = 10).

Memory: each step the policy writes up to `memory_slots` memory tokens, then END, then one action token. The
next observation shows that memory, and only memory can carry the clue to the answer. The environment ignores
memory otherwise: it is free, so a policy can pad it.

Token layout of a step (one row): prompt [P] = [clue or BLANK, hint, memory x M (PAD-filled), SEP] and
generated [M + 2] slots = memory tokens, END, action, PAD (`slot_kinds` says what each slot may hold).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

PAD, BLANK, SEP, END = 0, 1, 2, 3
# slot kinds: what a generated slot may hold (policy.allowed_tokens turns them into vocabulary masks)
KIND_MEMORY, KIND_END, KIND_ACTION, KIND_NONE = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The family's knobs (hashable: static under jit)."""

    lengths: tuple = (3, 5, 7)            # success lengths L (steps), one drawn per group
    length_weights: tuple = (1.0, 1.0, 1.0)
    failure_success_ratio: float = 4.0    # horizon H = round(ratio * L): the longest failure over the success
    trap_prob: float = 0.0                # a wrong press ends the episode with this probability (early failure)
    n_buttons: int = 3
    n_clues: int = 3
    memory_symbols: int = 4               # memory vocabulary (>= n_clues: symbol c can hold clue c)
    memory_slots: int = 3                 # M: memory tokens a step can write

    def __post_init__(self):
        if not self.failure_success_ratio >= 1:
            raise ValueError(f"failure_success_ratio={self.failure_success_ratio}: must be >= 1 (failures can "
                             "always run as long as a success)")
        if len(self.lengths) != len(self.length_weights) or min(self.lengths) < 1:
            raise ValueError(f"lengths {self.lengths} need one weight each ({self.length_weights}) and be >= 1")
        if self.memory_symbols < self.n_clues:
            raise ValueError(f"memory_symbols={self.memory_symbols} < n_clues={self.n_clues}: memory could not "
                             "hold every clue; raise memory_symbols")
        if not 0 <= self.trap_prob <= 1:
            raise ValueError(f"trap_prob={self.trap_prob}: must be in [0, 1]")

    # ---- the vocabulary: PAD BLANK SEP END | clue obs | hints (+ ANSWER) | memory symbols | press | answer
    @property
    def clue0(self):
        return 4

    @property
    def hint0(self):
        return self.clue0 + self.n_clues

    @property
    def answer_hint(self):
        return self.hint0 + self.n_buttons

    @property
    def memory0(self):
        return self.answer_hint + 1

    @property
    def press0(self):
        return self.memory0 + self.memory_symbols

    @property
    def answer0(self):
        return self.press0 + self.n_buttons

    @property
    def vocab_size(self):
        return self.answer0 + self.n_clues

    @property
    def horizons(self):
        return tuple(int(round(self.failure_success_ratio * n)) for n in self.lengths)

    @property
    def max_horizon(self):
        return max(self.horizons)

    @property
    def prompt_len(self):
        return 3 + self.memory_slots

    @property
    def gen_slots(self):
        return self.memory_slots + 2


class EnvState(NamedTuple):
    """One batch of episodes, every field [E] unless noted."""

    clue: jnp.ndarray       # int32
    length: jnp.ndarray     # int32 success length L
    horizon: jnp.ndarray    # int32 H
    hints: jnp.ndarray      # [E, max_horizon] int32 the button of each press
    progress: jnp.ndarray   # int32 correct presses so far
    t: jnp.ndarray          # int32 steps taken
    done: jnp.ndarray       # bool
    success: jnp.ndarray    # bool
    timed_out: jnp.ndarray  # bool ended by the horizon (its last step a press that did not trap), not by an answer
    memory: jnp.ndarray     # [E, M] int32 memory tokens written last step (PAD-filled)


def reset(config: EnvConfig, key, n_groups: int, group_size: int) -> EnvState:
    """n_groups task instances, each repeated group_size times (a GRPO group: same clue, length and hints)."""
    k_clue, k_len, k_hint = jax.random.split(key, 3)
    clue = jax.random.randint(k_clue, (n_groups,), 0, config.n_clues)
    weights = jnp.asarray(config.length_weights, jnp.float32)
    which = jax.random.choice(k_len, len(config.lengths), (n_groups,), p=weights / weights.sum())
    length = jnp.asarray(config.lengths, jnp.int32)[which]
    horizon = jnp.asarray(config.horizons, jnp.int32)[which]
    hints = jax.random.randint(k_hint, (n_groups, config.max_horizon), 0, config.n_buttons)

    def rep(x):
        return jnp.repeat(x, group_size, axis=0)

    e = n_groups * group_size
    return EnvState(clue=rep(clue), length=rep(length), horizon=rep(horizon), hints=rep(hints),
                    progress=jnp.zeros(e, jnp.int32), t=jnp.zeros(e, jnp.int32), done=jnp.zeros(e, bool),
                    success=jnp.zeros(e, bool), timed_out=jnp.zeros(e, bool),
                    memory=jnp.full((e, config.memory_slots), PAD, jnp.int32))


def ready(state: EnvState):
    """[E] bool: every press done, the answer is due."""
    return state.progress >= state.length - 1


def observe(config: EnvConfig, state: EnvState):
    """Prompt tokens [E, P] int32: [clue (first step only) or BLANK, hint, memory..., SEP]."""
    first = jnp.where(state.t == 0, config.clue0 + state.clue, BLANK)
    button = jnp.take_along_axis(state.hints, jnp.minimum(state.progress, config.max_horizon - 1)[:, None], 1)[:, 0]
    hint = jnp.where(ready(state), config.answer_hint, config.hint0 + button)
    sep = jnp.full_like(first, SEP)
    return jnp.concatenate([first[:, None], hint[:, None], state.memory, sep[:, None]], axis=1).astype(jnp.int32)


def parse(config: EnvConfig, generated, slot_kinds):
    """Generated slots [E, M + 2] -> (memory [E, M] PAD-filled, memory length [E], action token [E])."""
    is_memory = slot_kinds == KIND_MEMORY
    written = is_memory & (generated >= config.memory0) & (generated < config.press0)
    memory = jnp.where(written, generated, PAD)[:, :config.memory_slots]
    action = jnp.where(slot_kinds == KIND_ACTION, generated, 0).max(axis=1)
    return memory, written.sum(axis=1).astype(jnp.int32), action


def step(config: EnvConfig, state: EnvState, generated, slot_kinds, key):
    """Apply one step's generated slots to the episodes still running. Returns (new state, active [E] bool):
    `active` marks the episodes this step belonged to (not done before it)."""
    memory, _, action = parse(config, generated, slot_kinds)
    active = ~state.done
    is_answer = (action >= config.answer0) & (action < config.answer0 + config.n_clues)
    is_press = (action >= config.press0) & (action < config.answer0)
    due = ready(state)
    button = jnp.take_along_axis(state.hints, jnp.minimum(state.progress, config.max_horizon - 1)[:, None], 1)[:, 0]
    correct_press = is_press & ~due & (action - config.press0 == button)
    trapped = is_press & ~correct_press & (jax.random.uniform(key, action.shape) < config.trap_prob)
    success = is_answer & due & (action - config.answer0 == state.clue)
    t = state.t + 1
    done = is_answer | trapped | (t >= state.horizon) | ~(is_answer | is_press)
    timed_out = is_press & ~trapped & (t >= state.horizon)

    def keep(new, old):
        return jnp.where(active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old)

    new = state._replace(progress=keep(state.progress + correct_press, state.progress), t=keep(t, state.t),
                         done=keep(done, state.done), success=keep(success, state.success),
                         timed_out=keep(timed_out, state.timed_out),
                         memory=keep(memory, state.memory))
    return new, active
