"""The weights a policy server decodes from: a copy in the serving dtype, by default the model's compute dtype.

A run with fp32 master weights and bf16 compute (`model.param_dtype="float32"`, `model.dtype="bfloat16"`) keeps
the fp32 master in the trainer and publishes a bf16 copy: decode reads half the weight bytes. What changes in
the numbers: nothing for the text decoder and the LM head, whose every weight is cast to the compute dtype before
use (dense kernels and biases, embeddings, RMSNorm scales, `lm_head.head_logits`), so a bf16 copy computes the
same logits bit for bit. The vision tower's LayerNorm scales and biases and its learned position table are used
at the precision they are stored in, so there the served model sees bf16-rounded values where the trainer's
recompute sees fp32: behaviour log-probs of a screenshot prompt may differ from the trainer's proximal log-probs
by that rounding, which the decoupled objective's behaviour weight (proximal / behaviour) already corrects.
Log-probs stay fp32 either way (the sampler's logits are fp32). `rollout.serve_dtype="float32"` serves the master
precision when a run needs it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def serving_dtype(serve_dtype: str | None, model_config) -> jnp.dtype:
    """The dtype to decode from: `serve_dtype` ('float32', 'bfloat16'), or None: the model's compute dtype."""
    return jnp.dtype(serve_dtype or model_config.dtype)


def serving_copy(params, dtype) -> object:
    """A fresh copy of `params` with every floating leaf in `dtype` (other leaves copied as they are). It never
    aliases `params`, whose buffers the trainer's update donates."""
    dtype = jnp.dtype(dtype)

    def one(leaf):
        if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype != dtype:
            return leaf.astype(dtype)
        return leaf.copy()

    return jax.tree.map(one, params)

