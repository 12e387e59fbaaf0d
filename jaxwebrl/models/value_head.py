"""The value model's parameters and per-token values: a linear value head on a copy of the policy's trunk.

    params = value_model_params(policy_params, config)     # {"trunk": a copy without the LM head, "value_head"}
    values = token_values(hidden, params["value_head"])    # hidden [B, T, E] (module.apply(..., head="none"))

The trunk is the policy's own decoder and vision tower (the warm start's weights), so the critic reads the same
screenshots and tokens; the untied LM head is left out (the critic never uses it). The head is zero-initialised:
every value starts at 0, so the first train step's GAE equals the critic-free one.

Values are placed like log-probs: `values[:, t]` is V of the state token t is drawn from, the head applied to the
hidden state at t - 1 (the LM head's log-prob at t reads the same one); position 0 gets 0. fp32 whatever the
compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init_value_head(hidden_size: int) -> dict:
    """{"kernel": zeros [E] float32, "bias": 0 float32}: a zero head (V = 0 everywhere until it trains)."""
    return {"kernel": jnp.zeros((hidden_size,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}


def value_model_params(policy_params, config) -> dict:
    """{"trunk": a copy of `policy_params` without the untied LM head, "value_head": zero head} (`config`: the
    policy's ModelConfig)."""
    trunk = {k: jax.tree.map(lambda x: x.copy(), v) for k, v in policy_params.items() if k != "lm_head"}
    return {"trunk": trunk, "value_head": init_value_head(int(config.text.hidden_size))}


def token_values(hidden: jax.Array, head: dict) -> jax.Array:
    """hidden [B, T, E] -> values [B, T] float32, shifted so that values[:, t] = head(hidden[:, t - 1]) and
    values[:, 0] = 0 (see the module docstring)."""
    v = jnp.einsum("bte,e->bt", hidden.astype(jnp.float32), head["kernel"].astype(jnp.float32)) + head["bias"]
    return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1)
