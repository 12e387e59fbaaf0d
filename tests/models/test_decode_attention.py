"""The decode step's attention (models/decode_attention.py): the ragged read equals the dense read and the old
[B, S, K, D] kernel, reads no slot past the furthest filled one, and the compiled decode chunk relayouts no cache."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models import kv_cache
from jaxwebrl.models.attention import AttentionMask
from jaxwebrl.models.decode_attention import attend_cache
from jaxwebrl.models.layers import masked_attention
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.sampler import Sampler, SamplingParams, row_keys

B, H, K, D, S = 3, 4, 2, 8, 80
FILLED = np.array([10, 23, 38])        # slots written per row (the decode step's own key is the last)
PADDING = np.array([0, 4, 7])          # left padding of each row: never attended


def _case(seed=0, filled=FILLED):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, 1, H, D)), jnp.float32)
    cache = {name: jnp.asarray(rng.standard_normal((B, K, S, D)), jnp.float32) for name in ("k", "v")}
    slots = np.arange(S)[None, :]
    valid = (slots < filled[:, None]) & (slots >= PADDING[:, None])
    mask = AttentionMask(jnp.asarray(valid), jnp.asarray(filled - 1, jnp.int32)[:, None])
    return q, cache, mask


def _attend(q, cache, mask, block):
    return np.asarray(jax.jit(lambda *a: attend_cache(*a, 0.3, kv_cache.DecodeRead(block)))(q, cache, mask))


@pytest.mark.parametrize("block, filled", [(8, FILLED), (16, FILLED), (24, np.array([10, 23, 75]))],
                         ids=["divides", "divides_2", "last_block_moved_back"])
def test_ragged_read_equals_dense_read_and_the_old_layout_kernel(block, filled):
    q, cache, mask = _case(filled=filled)
    dense = _attend(q, cache, mask, 0)
    old = np.asarray(masked_attention(q, jnp.swapaxes(cache["k"], 1, 2), jnp.swapaxes(cache["v"], 1, 2),
                                      mask.dense(0, 1), 0.3))
    np.testing.assert_allclose(dense, old, atol=1e-5)
    np.testing.assert_allclose(_attend(q, cache, mask, block), dense, atol=1e-5)


def test_ragged_read_reads_no_block_past_the_furthest_filled_slot():
    """NaN in every slot past the last block the furthest row needs: a read of such a slot would reach the output
    (0 × NaN in the values' sum), as it does for the dense read."""
    q, cache, mask = _case(1)
    block = 16
    read = -(-FILLED.max() // block) * block                   # 48: slots 48..79 are never read
    poisoned = {name: x.at[:, :, read:].set(jnp.nan) for name, x in cache.items()}
    assert np.isnan(_attend(q, poisoned, mask, 0)).all()       # the dense read does read them
    np.testing.assert_allclose(_attend(q, poisoned, mask, block), _attend(q, cache, mask, 0), atol=1e-5)


def _cache_relayouts(hlo: str, cache_shape) -> list[str]:
    """Transposes and copies whose result holds a whole layer cache's elements (any axis order)."""
    out = []
    for line in hlo.splitlines():
        match = re.search(r"= \w+\[([\d,]+)\]\S* (transpose|copy)\(", line)
        if match and sorted(int(n) for n in match.group(1).split(",")) == sorted(cache_shape):
            out.append(line.strip()[:160])
    return out


@pytest.mark.parametrize("block", [0, 16], ids=["dense", "ragged"])
def test_compiled_decode_chunk_relayouts_no_cache(block):
    policy = tiny_policy(seed=0)
    c = policy.config
    sampler = Sampler(policy.module, c, decode_chunk=4, decode_block=block)
    rows, prompt, new = 4, 32, 40
    sampling = SamplingParams(max_new_tokens=new)
    ids = jnp.ones((rows, prompt), jnp.int32)
    cache = kv_cache.init_cache(c, rows, prompt + new, jnp.float32, decode_block=block)
    stop = jnp.asarray([-1], jnp.int32)
    state = sampler._prefill(policy.params, ids, jnp.ones_like(ids), None, cache, row_keys(0, rows, rows),
                             jnp.int32(0), stop, None, jnp.zeros((0,), jnp.int32), jnp.int32(0), grid=None,
                             sampling=sampling)
    hlo = sampler._decode.lower(policy.params, state, jnp.int32(0), jnp.int32(8), stop, None,
                                sampling=sampling).compile().as_text()
    cache_shape = state.cache["layers"][0]["k"].shape
    assert cache_shape == (rows, c.text.num_kv_heads, prompt + new, c.text.head_dim)
    assert _cache_relayouts(hlo, cache_shape) == []
    loops = len(re.findall(r"\bwhile\(", hlo))
    assert loops >= (1 + c.text.num_layers if block else 1)   # the ragged read: one key-block loop a layer


def test_the_relayout_check_sees_the_old_layout():
    """The check above finds the per-step transposes of the old [B, S, K, D] cache: the masked kernel fed that
    layout inside a loop, as the old decode step did."""
    q, cache, mask = _case()
    old_layout = {name: jnp.swapaxes(x, 1, 2) for name, x in cache.items()}     # [B, S, K, D]

    def steps(q, k, v):
        body = lambda i, acc: acc + masked_attention(q + acc, k, v, mask.dense(0, 1), 0.3)
        return jax.lax.fori_loop(0, 3, body, jnp.zeros_like(q))

    hlo = jax.jit(steps).lower(q, old_layout["k"], old_layout["v"]).compile().as_text()
    assert _cache_relayouts(hlo, cache["k"].shape)
