"""A tiny *trained* training checkpoint for eval/export tests, written by the trainer's own Checkpointer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs.constT10 import get_config
from jaxwebrl.checkpoint.policies import initial_policy
from jaxwebrl.checkpoint.checkpointer import Checkpointer


def toy_config():
    return get_config("toy")


def write_trained_checkpoint(workdir: str, *, steps: int = 2, version: int = 7):
    """Take `steps` AdamW steps of next-token loss on the recipe's initial policy and save them as train step
    `steps` (policy version `version`) under WORKDIR/checkpoints. Returns (config, trained params)."""
    config = toy_config()
    policy = initial_policy(config)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 200, (2, 12)), jnp.int32)

    def loss_fn(params):
        logits, _ = policy.module.apply({"params": params}, ids)
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.take_along_axis(logp, ids[:, 1:, None], -1).mean()

    optimizer = optax.adamw(1e-2)
    params, opt_state = policy.params, optimizer.init(policy.params)
    for _ in range(steps):
        grads = jax.grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    checkpointer = Checkpointer(f"{workdir}/checkpoints", async_save=False)
    checkpointer.save(steps, params=params, opt_state=opt_state, rng=jax.random.key(0),
                      meta={"policy_version": version, "buffer_cursor": None, "consumed_episode_ids": []})
    checkpointer.close()
    return config, params
