"""`cost.attention_work` prices what each XLA attention kernel runs: the dot FLOPs of the gradient of
`attention.attend` (causal rows) and `attend_unmasked` (images) equal its pairs x passes x 4·H·D, on dense XLA
(the whole square of a causal row) and chunked (the diagonal's blocks, images padded to whole chunks, checkpointed
chunks run again); the flash kernels' rows are arithmetic checked against the causal pairs they skip to."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models.attention import attend, attend_unmasked, causal_mask
from jaxwebrl.models.config import tiny_config
from jaxwebrl.parallel import cost
from tests.models.test_remat_policies import _dot_flops

H, KV, D = 4, 2, 8


def _qkv(b, t):
    rng = np.random.default_rng(0)
    return tuple(jnp.asarray(rng.standard_normal((b, t, h, D)), jnp.float32) for h in (H, KV, KV))


def _gradient_dot_flops(f, args) -> float:
    return _dot_flops(jax.make_jaxpr(jax.grad(lambda *xs: f(*xs).sum(), argnums=(0, 1, 2)))(*args).jaxpr)


@pytest.mark.parametrize("kernel, chunk", [("xla", 0), ("chunked", 16)])
@pytest.mark.parametrize("causal, t", [(True, 64), (True, 56), (False, 40)])
def test_xla_kernels_run_the_pairs_and_passes_the_cost_model_prices(kernel, chunk, causal, t):
    config = tiny_config().replace(attention_impl=kernel, attention_chunk=chunk, remat="none")
    b = 2
    args = _qkv(b, t)
    if causal:
        f = lambda q, k, v: attend(q, k, v, causal_mask(jnp.ones((b, t), bool)), 0.3, chunk, kernel)
    else:
        f = lambda q, k, v: attend_unmasked(q, k, v, 0.3, chunk, kernel)
    pairs, passes = cost.attention_work(config, [t] * b, causal=causal, trained=True)
    assert _gradient_dot_flops(f, args) == pytest.approx(4 * H * D * pairs * passes)


def test_flash_kernels_skip_past_the_diagonal_and_recompute_their_scores():
    config = tiny_config().replace(remat="none", dtype="bfloat16")
    t = 4096
    for kernel, tile in (("cudnn", 128), ("splash", 512)):
        pairs, passes = cost.attention_work(config.replace(attention_impl=kernel), [t], causal=True, trained=True)
        assert pairs == t * (t + tile) // 2 and passes == 1 + cost.FLASH_BACKWARD
        image, _ = cost.attention_work(config.replace(attention_impl=kernel), [3520], causal=False, trained=True)
        assert image == 3520 ** 2                      # an image whole: no padding, no mask
    full = config.replace(attention_impl="cudnn", remat="full")
    assert cost.attention_work(full, [t], causal=True, trained=True)[1] == 2 + cost.FLASH_BACKWARD
    assert cost.attention_work(full, [t], causal=True, trained=False)[1] == 1.0
