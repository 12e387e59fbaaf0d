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


def test_fused_kernel_equals_the_masked_kernel_on_right_padded_causal_rows():
    """impl="fused" (jax.nn.dot_product_attention: cuDNN flash attention on a GPU, its XLA kernel here) on the
    trainer's right-padded causal rows: the same outputs and gradients on real tokens, finite everywhere."""
    rng, _, _, _ = _inputs()
    q, k, v = (jnp.asarray(rng.standard_normal((3, 16, h, D)), jnp.float32) for h in (H, KV, KV))
    real = jnp.asarray(np.arange(16)[None, :] < np.array([16, 9, 1])[:, None])     # [3, 16] real tokens first
    mask = causal_mask(real)
    keep = real[:, :, None, None]

    def out(impl, q_):
        return attend(q_, k, v, mask, D**-0.5, 0, impl)

    np.testing.assert_allclose(out("fused", q) * keep, out("xla", q) * keep, atol=1e-5)
    assert np.isfinite(np.asarray(out("fused", q))).all()
    grads = {impl: jax.grad(lambda q_: (out(impl, q_) * keep).sum())(q) for impl in ("fused", "xla")}
    assert np.isfinite(np.asarray(grads["fused"])).all()
    np.testing.assert_allclose(grads["fused"], grads["xla"], atol=1e-5)


def test_the_model_with_the_fused_kernel_gives_the_same_logits_on_right_padded_rows():
    from jaxwebrl.models.config import tiny_config
    from jaxwebrl.models.policy import init_params

    config = tiny_config()
    module, params = init_params(config, seed=0)
    fused_module, _ = init_params(config.replace(attention_impl="fused"), seed=0)
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, config.text.vocab_size, (2, 24)), jnp.int32)
    real = jnp.asarray(np.arange(24)[None, :] < np.array([[24], [13]]))
    logits = {name: m.apply({"params": params}, ids, attention_mask=real.astype(jnp.int32))[0]
              for name, m in (("xla", module), ("fused", fused_module))}
    np.testing.assert_allclose(np.asarray(logits["fused"])[np.asarray(real)], np.asarray(logits["xla"])[np.asarray(real)],
                               atol=1e-4)
    with pytest.raises(ValueError, match="attention_impl"):
        config.replace(attention_impl="flash")
