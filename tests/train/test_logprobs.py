"""Log-probs without full-vocabulary logits equal the full-logits log-softmax (≤ 1e-5, fp32), grammar rows included.

The reference is the definition: full [B, T, V] logits from the model, restricted to the allowed tokens of each
position's grammar state, log-softmax, the target's entry. The trainer's path gathers the loss positions into a
bucket and runs the LM head over `logits_chunk` vocabulary entries at a time (an online log-sum-exp forward and a
custom backward that walks the same chunks). The tiny vocabulary (270) splits into chunks of 45 (the largest
divisor under 50), the small preset's (also 270 ids) likewise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.models import lm_head
from jaxwebrl.models.config import small_config, tiny_config
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.policy import init_params
from jaxwebrl.train.update import token_logprobs


def reference_logprobs(logits, input_ids, temperature, states=None, table=None):
    """The full-logits definition (what the trainer computed before the LM head was chunked)."""
    logits = logits[:, :-1].astype(jnp.float32) / temperature
    if states is not None:
        allowed = jnp.where(states[..., None] >= 0, table[jnp.maximum(states, 0)], True)[:, 1:]
        logits = jnp.where(allowed, logits, jnp.finfo(jnp.float32).min)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, input_ids[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def _rows(config, rng, rows=4, length=40):
    """Token rows whose last 12 tokens are a 'response' (loss mask 1); rows 0 and 2 were decoded under a grammar
    of 3 states (states 0..2), rows 1 and 3 unrestricted (states -1)."""
    vocab = config.text.vocab_size
    ids = rng.integers(0, min(vocab, 250), (rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.int32)
    mask[:, -12:] = 1
    mask[3, -12:-5] = 0          # a shorter response
    table = np.zeros((3, vocab), bool)
    for s in range(3):
        table[s, rng.choice(min(vocab, 250), 20, replace=False)] = True
    TokenConstraint(table, np.zeros_like(table, np.int32))   # every state admits tokens
    states = np.full((rows, length), -1, np.int32)
    for row in (0, 2):
        for j, t in enumerate(range(length - 12, length)):
            states[row, t] = j % 3
            ids[row, t] = np.flatnonzero(table[j % 3])[rng.integers(0, 20)]
    return ids, mask, states, table


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("chunk", [0, 50])
def test_bucketed_chunked_logprobs_equal_full_logits(preset, chunk):
    config = (tiny_config() if preset == "tiny" else small_config()).replace(logits_chunk=chunk)
    module, params = init_params(config, seed=1)
    rng = np.random.default_rng(0)
    ids, mask, states, table = _rows(config, rng)
    attention = np.ones_like(ids)
    logits, _ = module.apply({"params": params}, ids, attention_mask=attention)
    hidden, _ = module.apply({"params": params}, ids, attention_mask=attention, head="none")
    for temperature in (1.0, 0.7):
        want = reference_logprobs(logits, ids, temperature, jnp.asarray(states), jnp.asarray(table))
        positions = jnp.asarray(lm_head.loss_positions(mask))
        got, entropy = token_logprobs(hidden, params, config, ids, temperature, states=jnp.asarray(states),
                                      allowed_table=jnp.asarray(table), positions=positions)
        got, want = np.asarray(got), np.asarray(want)
        assert np.abs(got - want)[mask > 0].max() <= 1e-5
        assert (got[mask == 0] == 0).all()
        every, _ = token_logprobs(hidden, params, config, ids, temperature, states=jnp.asarray(states),
                                  allowed_table=jnp.asarray(table))
        assert np.abs(np.asarray(every) - want)[:, 1:].max() <= 1e-5
    # entropy of the restricted distribution at a grammar position, and of the full one elsewhere
    row, t = 0, ids.shape[1] - 3
    full = jax.nn.log_softmax(np.asarray(logits)[1, t - 1] / 0.7)        # row 1: unrestricted
    restricted = jax.nn.log_softmax(np.where(table[states[row, t]], np.asarray(logits)[row, t - 1] / 0.7, -1e30))
    p = np.exp(restricted)
    assert abs(float(entropy[row, t]) - float(-(p * np.where(p > 0, restricted, 0)).sum())) <= 1e-4
    p = np.exp(full)
    assert abs(float(entropy[1, t]) - float(-(p * full).sum())) <= 1e-4


def test_gradients_equal_the_full_logits_gradients():
    config = tiny_config().replace(logits_chunk=50)
    module, params = init_params(config, seed=2)
    ids, mask, states, table = _rows(config, np.random.default_rng(1))
    positions = jnp.asarray(lm_head.loss_positions(mask))

    def full(p):
        logits, _ = module.apply({"params": p}, ids)
        return (reference_logprobs(logits, ids, 1.0, jnp.asarray(states), jnp.asarray(table)) * mask).sum()

    def chunked(p):
        hidden, _ = module.apply({"params": p}, ids, head="none")
        lp, _ = token_logprobs(hidden, p, config, ids, 1.0, states=jnp.asarray(states),
                               allowed_table=jnp.asarray(table), positions=positions)
        return (lp * mask).sum()

    g_full, g_chunked = jax.grad(full)(params), jax.grad(chunked)(params)
    for a, b in zip(jax.tree_util.tree_leaves(g_full), jax.tree_util.tree_leaves(g_chunked)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)


def test_loss_positions_bucket():
    mask = np.zeros((3, 20), np.int32)
    mask[0, 0] = 1                 # position 0 never has a log-prob
    mask[1, 5:16] = 1              # 11 positions -> bucket 16
    positions = lm_head.loss_positions(mask)
    assert positions.shape == (3, 16)
    assert positions[1, :11].tolist() == list(range(5, 16)) and (positions[1, 11:] == 0).all()
    assert (positions[0] == 0).all() and (positions[2] == 0).all()
    assert lm_head.loss_positions(np.ones((1, 6), np.int32)).shape == (1, 6)   # never wider than the row
