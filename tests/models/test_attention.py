"""Chunked attention (query chunks; key blocks with an online softmax) equals the dense masked kernel, values and
gradients, for the three masks the model uses: the causal no-cache row, a KV cache's slots, and segment keys."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.attention import AttentionMask, attend, causal_mask

B, T, S, H, KV, D = 2, 37, 53, 4, 2, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, S, KV, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, S, KV, D)), jnp.float32)
    return rng, q, k, v


def _masks(rng):
    valid = jnp.asarray(rng.random((B, S)) > 0.3)
    slots = jnp.asarray(rng.integers(-1, S, (B, T)), jnp.int32)    # -1: a query with no key (a padded query)
    padded = np.ones((B, S), bool)
    padded[1, :9] = False                                            # a left-padded row
    return {"causal": (causal_mask(jnp.asarray(padded)), "self"), "cache": (AttentionMask(valid, slots), "cross"),
            "segments": (AttentionMask(valid), "cross")}


@pytest.mark.parametrize("name", ["causal", "cache", "segments"])
@pytest.mark.parametrize("chunk", [8, 16])
def test_chunked_equals_dense(name, chunk):
    rng, q, k, v = _inputs()
    mask, kind = _masks(rng)[name]
    if kind == "self":   # the causal row attends its own keys: T = S
        q = jnp.asarray(rng.standard_normal((B, S, H, D)), jnp.float32)

    # a query with no allowed key (padding) is don't-care: dense and chunked average different key sets there
    live = jnp.asarray(np.asarray(mask.dense(0, q.shape[1])).any(-1))[..., None, None]

    def out(c):
        return lambda q_, k_, v_: jnp.where(live, attend(q_, k_, v_, mask, 0.35, c), 0.0)

    np.testing.assert_allclose(np.asarray(out(chunk)(q, k, v)), np.asarray(out(0)(q, k, v)), atol=2e-6)
    loss = lambda c: (lambda q_, k_, v_: (out(c)(q_, k_, v_) ** 2).sum())
    dense = jax.grad(loss(0), argnums=(0, 1, 2))(q, k, v)
    chunked = jax.grad(loss(chunk), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(dense, chunked):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5)
