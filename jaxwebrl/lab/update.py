"""One RL update of the lab's policy on a batch of step rows, through the production rl/ path: the advantages of
`compute_token_advantages` (the arm's AdvantageConfig: 1/k or 1/|τ|, its estimator) and the arm's registered
actor loss (its clip, dual clip, behaviour-weight cap and aggregation). Plus the warm start's supervised step.

    params, opt_state, stats = rl_update(setup, params, opt_state, rows)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from jaxwebrl.lab import env as env_lib
from jaxwebrl.lab import policy as policy_lib
from jaxwebrl.lab.recipes import LabRecipe
from jaxwebrl.lab.rollout import Rows
from jaxwebrl.rl import aggregation
from jaxwebrl.rl.advantages import compute_token_advantages


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything static about one arm's training (hashable)."""

    env: env_lib.EnvConfig
    policy: policy_lib.PolicyConfig
    recipe: LabRecipe
    n_groups: int = 4
    group_size: int = 4
    lr: float = 3e-3
    epochs: int = 2            # passes over each batch (the second one is where clipping can act)
    lag: int = 0               # rollouts by the policy of `lag` updates ago (decoupled importance weights)
    warm_start_steps: int = 30
    warm_start_epsilon: float = 0.3

    def optimizer(self):
        return optax.adam(self.lr)


def token_advantages(setup: Setup, rows: Rows):
    """[R, G] float32 per-token advantages of the arm (0 off the loss mask)."""
    return compute_token_advantages(rows.rewards, rows.episode_ids, rows.group_ids, rows.loss_mask,
                                    config=setup.recipe.advantage).advantages


def rows_logprobs(setup: Setup, params, rows: Rows):
    return policy_lib.token_logprobs(setup.env, setup.policy, params, rows.prompt, rows.generated, rows.slot_kinds)


def policy_loss(setup: Setup, params, rows: Rows, advantages, prox_logprobs):
    """(loss, stats) of the arm's registered loss on the rows."""
    logprobs = rows_logprobs(setup, params, rows)
    return setup.recipe.loss_fn()(logprobs, prox_logprobs, rows.behave_logprobs, advantages, rows.loss_mask)


def failure_weight_share(setup: Setup, rows: Rows, advantages):
    """Share of the loss's |advantage| weight on failed episodes' tokens, under the arm's own aggregation."""
    recipe = setup.recipe
    weight = jnp.abs(advantages) * rows.loss_mask
    failed = (rows.rewards <= 0)[:, None]

    def total(x):
        return aggregation.aggregate(x, rows.loss_mask, recipe.agg_mode, normalizer=recipe.agg_normalizer)

    whole = total(weight)
    return jnp.where(whole > 0, total(jnp.where(failed, weight, 0.0)) / jnp.maximum(whole, 1e-30), jnp.nan)


def rl_update(setup: Setup, params, opt_state, rows: Rows):
    """`setup.epochs` full-batch steps against the proximal policy (the params before the update).
    Returns (params, opt_state, stats: clip_ratio averaged over the epochs, failure_weight_share)."""
    advantages = token_advantages(setup, rows)
    prox = jax.lax.stop_gradient(rows_logprobs(setup, params, rows))
    optimizer = setup.optimizer()
    clip = jnp.float32(0.0)
    for _ in range(setup.epochs):
        grads, stats = jax.grad(lambda p: policy_loss(setup, p, rows, advantages, prox), has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        clip = clip + stats["clip_ratio"] / setup.epochs
    return params, opt_state, {"clip_ratio": clip, "failure_weight_share": failure_weight_share(setup, rows, advantages)}


def supervised_step(setup: Setup, params, opt_state, rows: Rows):
    """One step of token cross-entropy on demonstration rows (the warm start). Returns (params, opt_state, loss)."""
    mask = rows.loss_mask.astype(jnp.float32)

    def loss(p):
        return -(rows_logprobs(setup, p, rows) * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = setup.optimizer().update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value
