"""Optimizer precision: AdamW moments in another dtype than the weights (bf16 weights, fp32 moments).

    tx = with_moments_dtype(optax.adamw(...), "float32")

The wrapped transformation sees the gradients and params cast to `dtype` (so its state, the Adam moments, is held
in `dtype` and the update is computed there) and hands back updates in each parameter's own dtype. With bf16
weights this keeps the moments' precision at half the weight memory of an fp32 master copy; the bf16 weight update
itself still rounds (updates below half a bf16 ulp of a weight are lost: prefer fp32 master weights when memory
allows, `model.param_dtype = "float32"`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxwebrl.parallel.partition import cast_floating


def with_moments_dtype(inner: optax.GradientTransformation, dtype) -> optax.GradientTransformation:
    """`inner` computed in `dtype`: state (moments) in `dtype`, updates returned in the params' dtypes."""
    dtype = jnp.dtype(dtype)

    def init(params):
        return inner.init(cast_floating(params, dtype))

    def update(updates, state, params=None):
        like = updates
        updates, state = inner.update(cast_floating(updates, dtype), state,
                                      None if params is None else cast_floating(params, dtype))
        return jax.tree.map(lambda u, ref: u.astype(ref.dtype), updates, like), state

    return optax.GradientTransformation(init, update)
