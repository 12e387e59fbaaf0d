"""Masked GAE: terminal vs truncated, padding as absent time, turn-unit and SAO GAE, λ functions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxwebrl.rl import gae
from tests.rl import numpy_reference as ref


def test_truncated_bootstrap_hand_computed():
    rewards = np.array([[1.0, 2.0]])
    mask = np.ones((1, 2))
    returns = gae.discounted_returns(rewards, mask, gamma=0.5, bootstrap_values=np.array([10.0]),
                                     terminated=np.array([False]))
    np.testing.assert_allclose(returns, [[4.5, 7.0]])
    wrongly_terminal = gae.discounted_returns(rewards, mask, gamma=0.5, bootstrap_values=np.array([10.0]),
                                              terminated=np.array([True]))
    np.testing.assert_allclose(wrongly_terminal, [[2.0, 2.0]])


def test_padding_is_absent_time_not_a_terminal():
    dense = gae.discounted_returns(np.array([[1.0, 2.0]]), np.ones((1, 2)), gamma=0.5,
                                   bootstrap_values=np.array([10.0]), terminated=np.array([False]))
    padded = gae.discounted_returns(np.array([[0.0, 1.0, 0.0, 0.0, 2.0, 0.0]]),
                                    np.array([[0, 1, 0, 0, 1, 0]]), gamma=0.5,
                                    bootstrap_values=np.array([10.0]), terminated=np.array([False]))
    np.testing.assert_allclose(np.asarray(padded)[0, [1, 4]], np.asarray(dense)[0])
    assert np.all(np.asarray(padded)[0, [0, 2, 3, 5]] == 0.0)


def test_lambda_one_terminal_gives_return_minus_value():
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    mask = np.ones((3, 7))
    adv, returns = gae.masked_gae(r, mask, v, gamma=0.9, lam=1.0)
    g = gae.discounted_returns(r, mask, gamma=0.9)
    np.testing.assert_allclose(adv, np.asarray(g) - v, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns, g, rtol=1e-5, atol=1e-5)


def test_gamma_lambda_one_is_masked_reverse_cumsum():
    r = np.array([[0.0, 0.0, 0.0, 0.3, 0.0]])
    mask = np.array([[0, 1, 1, 1, 0]])
    adv, _ = gae.masked_gae(r, mask)
    np.testing.assert_allclose(adv, [[0.0, 0.3, 0.3, 0.3, 0.0]], rtol=1e-6)


_jit_gae = jax.jit(gae.masked_gae, static_argnames=())


@settings(max_examples=30, deadline=None)
@given(data=st.data(), batch=st.integers(1, 4), time=st.integers(1, 9),
       gamma=st.sampled_from([1.0, 0.9, 0.5]), lam=st.sampled_from([1.0, 0.95, 0.0]), critic=st.booleans())
def test_masked_gae_matches_numpy_reference(data, batch, time, gamma, lam, critic):
    """Random rows embedded in a fixed [4, 9] padded block (one compile): padding must not matter."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    r, v = rng.normal(size=(batch, time)), rng.normal(size=(batch, time))
    if not critic:
        v = np.zeros_like(v)
    mask = rng.random((batch, time)) < 0.7
    boot = rng.normal(size=batch)
    term = rng.random(batch) < 0.5
    pad = lambda a, fill=0.0: np.pad(a, [(0, 4 - batch), (0, 9 - time)][: a.ndim], constant_values=fill)  # noqa: E731
    got = _jit_gae(pad(r, 5.0), pad(mask, False), pad(v, -3.0) if critic else None, gamma=gamma, lam=lam,
                   bootstrap_values=pad(boot), terminated=pad(term, True))
    want = ref.masked_gae(r, mask, v, gamma=gamma, lam=lam, bootstrap_values=boot, terminated=term)
    for g, w in zip(got, want):
        g = np.asarray(g)
        np.testing.assert_allclose(g[:batch, :time], w, rtol=1e-4, atol=1e-4)
        assert np.all(g[batch:] == 0.0) and np.all(g[:, time:] == 0.0)


def test_masked_gae_is_jittable_with_per_row_lambda():
    f = jax.jit(lambda r, m, lam: gae.masked_gae(r, m, gamma=0.9, lam=lam)[0])
    r = jnp.ones((2, 3))
    out = f(r, jnp.ones((2, 3)), jnp.array([0.0, 1.0]))
    want0 = ref.masked_gae(np.ones((1, 3)), np.ones((1, 3)), gamma=0.9, lam=0.0)[0]
    want1 = ref.masked_gae(np.ones((1, 3)), np.ones((1, 3)), gamma=0.9, lam=1.0)[0]
    np.testing.assert_allclose(out, np.concatenate([want0, want1]), rtol=1e-5)


def test_turn_unit_gae_one_step_per_turn_broadcast_to_tokens():
    # row: prompt, turn0 (2 tokens), observation, turn1 (3 tokens), padding
    turn_ids = np.array([[-1, 0, 0, -1, 1, 1, 1, -1]])
    rewards = np.array([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0]])
    values = np.array([[0.0, 0.5, 9.0, 0.0, 0.25, 9.0, 9.0, 0.0]])
    adv, ret = gae.turn_gae(rewards, turn_ids, values, max_turns=4, gamma=0.5, lam=1.0)
    # turns: r = [1, 2], V(first token) = [0.5, 0.25]; A1 = 2 - 0.25; A0 = 1 + 0.5*0.25 - 0.5 + 0.5*A1
    a1 = 2.0 - 0.25
    a0 = 1.0 + 0.5 * 0.25 - 0.5 + 0.5 * a1
    np.testing.assert_allclose(adv, [[0, a0, a0, 0, a1, a1, a1, 0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[0, 1], a0 + 0.5, rtol=1e-6)


def test_turn_gae_rejects_too_many_turns():
    with pytest.raises(ValueError, match="max_turns"):
        gae.turn_gae(np.zeros((1, 3)), np.array([[0, 1, 2]]), max_turns=2)


def test_skip_observation_gae_bridges_observations():
    r = np.array([[0.0, 1.0]])
    first = np.array([[0.2, 0.7]])
    last = np.array([[0.4, 0.9]])
    valid = np.ones((1, 2))
    adv, _ = gae.skip_observation_gae(r, first, last, valid, gamma=0.5, lam=1.0)
    a1 = 1.0 - 0.9                      # terminal after the last action
    a0 = 0.0 + 0.5 * 0.7 - 0.4 + 0.5 * a1
    np.testing.assert_allclose(adv, [[a0, a1]], rtol=1e-6, atol=1e-6)
    # λ = 0 reduces to one-step TD errors
    td, _ = gae.skip_observation_gae(r, first, last, valid, gamma=0.5, lam=0.0)
    np.testing.assert_allclose(td, [[0.5 * 0.7 - 0.4, a1]], rtol=1e-6, atol=1e-6)
    # truncation keeps the bootstrap, a true terminal (done) removes it
    trunc, _ = gae.skip_observation_gae(r, first, last, valid, gamma=0.5, lam=0.0,
                                        bootstrap_values=np.array([3.0]), terminated=np.array([False]))
    np.testing.assert_allclose(np.asarray(trunc)[0, 1], 1.0 + 1.5 - 0.9, rtol=1e-6)
    done, _ = gae.skip_observation_gae(r, first, last, valid, dones=np.array([[1, 0]]), gamma=0.5, lam=1.0)
    np.testing.assert_allclose(np.asarray(done)[0, 0], -0.4, rtol=1e-6)
    # padding between actions is absent time
    pad, _ = gae.skip_observation_gae(np.array([[0.0, 0.0, 1.0]]), np.array([[0.2, 5.0, 0.7]]),
                                      np.array([[0.4, 5.0, 0.9]]), np.array([[1, 0, 1]]), gamma=0.5, lam=1.0)
    np.testing.assert_allclose(np.asarray(pad)[0, [0, 2]], [a0, a1], rtol=1e-6, atol=1e-6)


def test_lambda_functions():
    lengths = np.array([0, 1, 2, 5])
    np.testing.assert_allclose(gae.relative_position_lambda(lengths, q=0.5), [0, 1, 0.5, 0.5 ** 0.25], rtol=1e-6)
    np.testing.assert_allclose(gae.vapo_length_adaptive_lambda(lengths, alpha=0.5), [0, 0, 0, 0.6], rtol=1e-6)
    assert gae.resolve_lambda(0.9, lengths) == 0.9
    np.testing.assert_allclose(gae.resolve_lambda("relative_position", lengths, (("q", 0.5),))[2], 0.5)
    with pytest.raises(ValueError, match="unknown gae_lambda"):
        gae.resolve_lambda("nope", lengths)
    with pytest.raises(ValueError, match="q"):
        gae.relative_position_lambda(lengths, q=1.5)


def test_relative_position_lambda_keeps_q_at_the_first_step():
    for length in (2, 3, 7):
        lam = gae.relative_position_lambda(np.array([length]), q=0.25)
        r = np.zeros((1, length))
        r[0, -1] = 1.0
        adv, _ = gae.masked_gae(r, np.ones((1, length)), gamma=1.0, lam=lam)
        np.testing.assert_allclose(np.asarray(adv)[0, 0], 0.25, rtol=1e-5)
