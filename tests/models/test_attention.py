"""Every attention path equals the dense masked kernel, values and gradients: query chunks (with key blocks and an
online softmax for the cache's masks), packed rows with segment ids, the cuDNN call's arguments (run on JAX's XLA
kernel here), the unmasked batch of same-sized images, and the vision tower's segment attention for equal and
mixed image sizes; the batched vision path nests no `jax.checkpoint`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models import vision_layout
from jaxwebrl.models.attention import AttentionMask, attend, attend_unmasked, causal_mask
from jaxwebrl.models.attention_kernels import cudnn_attention
from jaxwebrl.models.layers import masked_attention
from jaxwebrl.models.vision_blocks import segment_attention

B, T, S, H, KV, D = 2, 37, 53, 4, 2, 8


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((B, S, KV, D)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((B, S, KV, D)), jnp.float32)
    return rng, q, k, v


def _qkv(rng, b, t):
    return tuple(jnp.asarray(rng.standard_normal((b, t, h, D)), jnp.float32) for h in (H, KV, KV))


def _masks(rng):
    valid = jnp.asarray(rng.random((B, S)) > 0.3)
    slots = jnp.asarray(rng.integers(-1, S, (B, T)), jnp.int32)    # -1: a query with no key (a padded query)
    padded = np.ones((B, S), bool)
    padded[1, :9] = False                                            # a left-padded row
    return {"causal": (causal_mask(jnp.asarray(padded)), "self"), "cache": (AttentionMask(valid, slots), "cross"),
            "segments": (AttentionMask(valid), "cross")}


def _same_values_and_grads(f, reference, args, atol=2e-5):
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(reference(*args)), atol=atol)
    loss = lambda g: (lambda *xs: (g(*xs) ** 2).sum())
    argnums = tuple(range(len(args)))
    for a, b in zip(jax.grad(loss(f), argnums)(*args), jax.grad(loss(reference), argnums)(*args)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol)


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
        return lambda q_, k_, v_: jnp.where(live, attend(q_, k_, v_, mask, 0.35, c, "chunked" if c else "xla"), 0.0)

    _same_values_and_grads(out(chunk), out(0), (q, k, v))


@pytest.mark.parametrize("kernel, chunk", [("xla", 0), ("chunked", 8)])
def test_packed_rows_with_segment_ids_equal_each_sequence_alone(kernel, chunk):
    """Row 0 packs a 7-token and a 9-token sequence, then 4 padding tokens; row 1 is one 20-token sequence. With
    segment ids every real token's output (and gradient) is that of its sequence run alone."""
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 2, 20)
    segment_ids = jnp.asarray(np.array([[1] * 7 + [2] * 9 + [0] * 4, [1] * 20]), jnp.int32)
    real = jnp.asarray(np.array([[True] * 16 + [False] * 4, [True] * 20]))
    mask = causal_mask(real, segment_ids)
    pieces = [(0, 0, 7), (0, 7, 16), (1, 0, 20)]    # (row, start, stop) of every sequence

    def packed(q_, k_, v_):
        out = attend(q_, k_, v_, mask, 0.3, chunk, kernel)
        return jnp.concatenate([out[r, a:b] for r, a, b in pieces])

    def alone(q_, k_, v_):
        outs = []
        for r, a, b in pieces:
            one = lambda x: x[r:r + 1, a:b]
            outs.append(attend(one(q_), one(k_), one(v_), causal_mask(jnp.ones((1, b - a), bool)), 0.3, 0, "xla")[0])
        return jnp.concatenate(outs)

    _same_values_and_grads(packed, alone, (q, k, v))


@pytest.mark.parametrize("packed", [False, True])
def test_the_cudnn_call_on_xla_equals_the_masked_kernel_on_right_padded_rows(packed):
    """`cudnn_attention`'s arguments (causal, each row's length, segment ids as a mask) run on JAX's XLA kernel
    (`implementation="xla"`: cuDNN needs a GPU) give the dense masked kernel's outputs and gradients on real
    tokens, and finite values everywhere."""
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, 3, 16)
    lengths = np.array([16, 9, 1])
    real = jnp.asarray(np.arange(16)[None, :] < lengths[:, None])     # [3, 16] real tokens first
    segment_ids = jnp.asarray(np.where(np.arange(16) < 5, 1, 2)[None].repeat(3, 0), jnp.int32) if packed else None
    mask = causal_mask(real, segment_ids)
    keep = real[:, :, None, None]

    def call(q_, k_, v_):
        return cudnn_attention(q_, k_, v_, D**-0.5, causal=True, lengths=jnp.asarray(lengths, jnp.int32),
                               segment_ids=segment_ids, implementation="xla") * keep

    def dense(q_, k_, v_):
        return masked_attention(q_, k_, v_, mask.dense(0, 16), D**-0.5) * keep

    assert np.isfinite(np.asarray(call(q, k, v))).all()
    _same_values_and_grads(call, dense, (q, k, v))


@pytest.mark.parametrize("kernel, chunk", [("xla", 0), ("chunked", 8)])
def test_unmasked_attention_equals_the_dense_kernel(kernel, chunk):
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 3, 21)
    everything = jnp.ones((3, 21, 21), bool)
    _same_values_and_grads(lambda *xs: attend_unmasked(*xs, 0.4, chunk, kernel),
                           lambda *xs: masked_attention(*xs, everything, 0.4), (q, k, v))


@pytest.mark.parametrize("lengths", [[20, 20, 20], [20, 12, 7]])
@pytest.mark.parametrize("kernel, chunk", [("xla", 0), ("chunked", 8)])
def test_vision_segment_attention_equals_each_image_alone(lengths, kernel, chunk):
    """Same-sized images (the batched path: a reshape, no mask, no padding) and mixed sizes (the gather path)
    give every patch the attention over its own image only."""
    rng = np.random.default_rng(6)
    n = sum(lengths)
    q, k, v = (jnp.asarray(rng.standard_normal((n, h, D)), jnp.float32) for h in (H, H, H))
    layout = vision_layout.segment_layout(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])

    def alone(q_, k_, v_):
        outs = []
        for a, m in zip(starts, lengths):
            one = lambda x: x[None, a:a + m]
            outs.append(masked_attention(one(q_), one(k_), one(v_), jnp.ones((1, m, m), bool), 0.3)[0])
        return jnp.concatenate(outs)

    _same_values_and_grads(lambda *xs: segment_attention(*xs, layout, 0.3, chunk, kernel), alone, (q, k, v))


def test_left_padded_rows_through_the_cudnn_branch_equal_the_masked_kernel(monkeypatch):
    """The sampler's left-padded prompts on `attend`'s cuDNN branch (each row turned to right padding for the call
    and back; the call run on JAX's XLA kernel here) give the dense masked kernel's outputs on real tokens."""
    import functools

    import jaxwebrl.models.attention as attention

    monkeypatch.setattr(attention, "cudnn_attention", functools.partial(cudnn_attention, implementation="xla"))
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, 3, 16)
    lengths = np.array([16, 9, 1])
    real = jnp.asarray(np.arange(16)[None, :] >= 16 - lengths[:, None])      # [3, 16] real tokens last
    mask = causal_mask(real, left_padded=True)
    keep = np.asarray(real)[:, :, None, None]
    out = attend(q, k, v, mask, D**-0.5, 0, "cudnn")
    dense = masked_attention(q, k, v, mask.dense(0, 16), D**-0.5)
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out) * keep, np.asarray(dense) * keep, atol=2e-5)


def _gradient_temp_bytes(f, *args) -> int:
    """Temporary bytes of the compiled gradient of sum(f(*args)) with respect to every argument."""
    grad = jax.jit(jax.grad(lambda *xs: f(*xs).sum(), argnums=tuple(range(len(args)))))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_chunked_unmasked_attention_holds_a_fraction_of_the_dense_scores():
    """Images in key blocks with an online softmax: the compiled gradient's temporaries stay a fraction of the
    dense kernel's (query chunks over all of each image's keys, unrolled, held as much as dense: 392 vs 388 MiB
    at 8 x 1,024 patches, and took the real-width rehearsal past 20 GiB; key blocks 62 MiB)."""
    q, k, v = _qkv(np.random.default_rng(7), 4, 512)
    chunked = _gradient_temp_bytes(lambda *xs: attend_unmasked(*xs, 0.4, 64, "chunked"), q, k, v)
    dense = _gradient_temp_bytes(lambda *xs: attend_unmasked(*xs, 0.4, 0, "xla"), q, k, v)
    assert chunked < dense / 3, (chunked, dense)


def test_batched_vision_attention_nests_no_checkpoint():
    """Same-sized images on the xla kernel: plain batched attention, no `jax.checkpoint` inside the block's remat
    (the chunked kernel keeps one per query chunk: the check can see it)."""
    layout = vision_layout.segment_layout([20, 20, 20])
    x = jnp.ones((60, 2, 8), jnp.float32)

    def program(kernel):
        return str(jax.make_jaxpr(lambda q: segment_attention(q, q, q, layout, 0.3, 8, kernel))(x))

    assert "remat" not in program("xla")
    assert "remat" in program("chunked")


def test_the_model_gives_the_same_logits_on_every_cpu_kernel():
    from jaxwebrl.models.config import tiny_config
    from jaxwebrl.models.policy import init_params

    config = tiny_config()
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(0, config.text.vocab_size, (2, 24)), jnp.int32)
    real = jnp.asarray(np.arange(24)[None, :] < np.array([[24], [13]]))
    logits = {}
    for kernel, chunk in (("xla", 0), ("chunked", 8), ("auto", 8)):
        module, params = init_params(config.replace(attention_impl=kernel, attention_chunk=chunk), seed=0)
        logits[kernel] = np.asarray(module.apply({"params": params}, ids, attention_mask=real.astype(jnp.int32))[0])
    for kernel in ("chunked", "auto"):
        np.testing.assert_allclose(logits[kernel][np.asarray(real)], logits["xla"][np.asarray(real)], atol=1e-4)
    with pytest.raises(ValueError, match="attention_impl='flash': use one of"):
        config.replace(attention_impl="flash")
    with pytest.raises(ValueError, match="attention_impl='cudnn'.*bf16.*model.dtype=bfloat16"):
        config.replace(attention_impl="cudnn")
