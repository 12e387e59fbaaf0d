"""The critic's clipped value loss (AReaL's ppo_critic_loss_fn, mse) against a hand computation."""

import jax
import numpy as np
import pytest

from jaxwebrl.rl.value_loss import clipped_value_loss


def test_value_clip_matches_a_hand_computation():
    # token: v, v_old, R -> plain ½(v-R)², clipped v_c = v_old + clip(v - v_old, ±0.2), ½(v_c-R)², max
    v = np.array([[1.0, 0.5, -0.3, 2.0]], np.float32)
    old = np.array([[0.5, 0.4, 0.0, 0.0]], np.float32)
    ret = np.array([[1.2, 0.0, -1.0, 9.0]], np.float32)
    mask = np.array([[1, 1, 1, 0]], np.int32)          # the last token is off the mask
    # t0: plain 0.5*0.04=0.02; v_c=0.7 -> 0.5*0.25=0.125 (clipped larger)
    # t1: plain 0.5*0.25=0.125; v_c=0.5 (|0.1|<0.2) -> same 0.125 (not larger)
    # t2: plain 0.5*0.49=0.245; v_c=-0.2 -> 0.5*0.64=0.32 (clipped larger)
    loss, stats = clipped_value_loss(v, old, ret, mask, value_eps_clip=0.2)
    np.testing.assert_allclose(float(loss), (0.125 + 0.125 + 0.32) / 3, rtol=1e-6)
    np.testing.assert_allclose(float(stats["value_clip_ratio"]), 2 / 3, rtol=1e-6)
    unclipped, stats = clipped_value_loss(v, old, ret, mask, value_eps_clip=None)
    np.testing.assert_allclose(float(unclipped), (0.02 + 0.125 + 0.245) / 3, rtol=1e-6)
    assert float(stats["value_clip_ratio"]) == 0.0


def test_gradient_flows_through_values_only_and_stops_where_the_clip_wins():
    v = np.array([[1.0, 0.45, 5.0]], np.float32)
    old = np.array([[0.5, 0.4, 0.0]], np.float32)
    ret = np.array([[1.2, 0.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 0]], np.int32)
    grad = jax.grad(lambda x: clipped_value_loss(x, old, ret, mask, value_eps_clip=0.2)[0])(v)
    # t0: the clipped term wins and v_c is clipped at v_old + 0.2 -> no gradient; t1: plain (v - R) / 2 tokens
    np.testing.assert_allclose(np.asarray(grad), [[0.0, 0.45 / 2, 0.0]], atol=1e-7)


@pytest.mark.parametrize("bad", [0.0, -0.1, True])
def test_a_bad_clip_is_refused(bad):
    with pytest.raises(ValueError, match="value_eps_clip"):
        clipped_value_loss(np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), value_eps_clip=bad)
