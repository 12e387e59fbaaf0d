"""The trainer's starting state: the policy's weights with a fresh optimizer state, or what `checkpoint/resume.py`
restores (this workdir's checkpoint, `checkpoint.restore_from`, `model.init_params`, in that order), committed to
its devices either way, so that a fresh start and a resume share their compiled programs.

    state, resume = starting_state(config, checkpointer, policy, optimizer, critic=None, mesh=None)
    # state: TrainState(params, opt_state, step, version, rng); resume: {"cursor", "consumed", "totals"}
"""

from __future__ import annotations

import dataclasses

import jax

from jaxwebrl.checkpoint.resume import restore_or_init
from jaxwebrl.parallel import distributed, partition
from jaxwebrl.parallel.multihost import place_train_state


@dataclasses.dataclass
class TrainState:
    """What the update carries from step to step: the weights, their optimizer state, the step and policy version
    reached, and the run's PRNG key."""

    params: object
    opt_state: object
    step: int
    version: int
    rng: jax.Array


def starting_state(config, checkpointer, policy, optimizer, *, critic=None, mesh=None) -> tuple[TrainState, dict]:
    """(the run's starting TrainState, its buffer resume point {"cursor", "consumed", "totals"}). A critic (critic
    PPO's value model) gets its state from the checkpoint, else a fresh one on the starting (warm) weights.
    mesh None: one device; else global arrays every process's update and Orbax save share, each device given only
    its shard (`parallel/multihost.py`)."""
    rng = jax.random.key(config.seed)
    if mesh is None:   # the update donates its params: a copy, so that the policy's own stay intact
        params = jax.tree.map(lambda x: x.copy(), policy.params)
    else:
        params, rng = place_train_state(policy.params, rng, mesh)
    opt_state = partition.init_state(optimizer.init, params)   # each moment sharded like its weight
    start = restore_or_init(config, checkpointer, params=params, opt_state=opt_state, rng=rng,
                            set_aside=distributed.is_primary(),
                            critic=None if critic is None else critic.init_state(params))
    # committed like a restored state, so a fresh start and a resume share their compiled programs
    params, opt_state, rng = partition.committed((start.params, start.opt_state, start.rng))
    if critic is not None:
        critic.state = partition.committed(start.critic if start.critic is not None else critic.init_state(params))
    resume = {"cursor": start.cursor, "consumed": start.consumed, "totals": start.totals}
    return TrainState(params, opt_state, start.step, start.version, rng), resume
