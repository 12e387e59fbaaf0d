"""Advantage path: seed 000's identities, 1/k vs 1/T_e, placement, KL reward, estimators, jit, NumPy parity."""

import dataclasses

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxwebrl.rl import advantages as A
from jaxwebrl.rl import estimators as E
from jaxwebrl.rl import gae
from jaxwebrl.rl.normalization import NormConfig
from tests.rl import numpy_reference as ref


def _group_of_eight(successes, steps_success=2, steps_failure=3):
    rewards, episodes = [], []
    for e in range(8):
        win = e < successes
        t = steps_success if win else steps_failure
        rewards += [float(win)] * t
        episodes += [100 + e] * t
    return np.array(rewards), np.array(episodes), np.full(len(rewards), 7)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_seed000_identity_sqrt_8_minus_k_over_k(k):
    rewards, episodes, groups = _group_of_eight(k)
    # const_length=1 leaves r̂ itself on every row
    out = np.asarray(A.step_advantages(rewards, episodes, groups, const_length=1.0))
    expect = np.sqrt((8 - k) / k)
    np.testing.assert_allclose(out[rewards == 1], expect, rtol=1e-4)
    np.testing.assert_allclose(out[rewards == 0], -1.0 / expect, rtol=1e-4)


@pytest.mark.parametrize("k", [0, 8])
def test_all_success_or_all_failure_group_is_exactly_zero(k):
    rewards, episodes, groups = _group_of_eight(k)
    out = np.asarray(A.step_advantages(rewards, episodes, groups))
    assert np.all(out == 0.0)


def test_const_length_vs_episode_length():
    rewards, episodes, groups = _group_of_eight(4, steps_success=2, steps_failure=5)
    r_hat = np.where(rewards == 1, 1.0, -1.0)  # k = 4 of 8: ±1
    per_t = np.asarray(A.step_advantages(rewards, episodes, groups))
    const = np.asarray(A.step_advantages(rewards, episodes, groups, const_length=10))
    steps = np.where(rewards == 1, 2.0, 5.0)
    np.testing.assert_allclose(per_t, r_hat / steps, rtol=1e-4)
    np.testing.assert_allclose(const, r_hat / 10.0, rtol=1e-4)


def test_unbiased_std_switch():
    rewards, episodes, groups = _group_of_eight(4)
    out = np.asarray(A.step_advantages(rewards, episodes, groups, const_length=1, std_unbiased=True))
    np.testing.assert_allclose(out[rewards == 1], np.sqrt(7.0 / 8.0), rtol=1e-4)


def test_step_advantages_rejects_inconsistent_rows():
    with pytest.raises(ValueError, match="different rewards"):
        A.step_advantages(np.array([1.0, 0.0]), np.array([0, 0]), np.array([0, 0]))
    with pytest.raises(ValueError, match="group ids"):
        A.step_advantages(np.array([0.0, 1.0, 1.0]), np.array([4, 0, 0]), np.array([2, 0, 1]))
    with pytest.raises(ValueError, match="const_length"):
        A.step_advantages(np.array([1.0]), np.array([0]), np.array([0]), const_length=0)


def test_step_advantages_jittable_and_order_invariant():
    rewards, episodes, groups = _group_of_eight(3)
    groups = groups.copy()
    perm = np.random.default_rng(0).permutation(len(rewards))
    f = jax.jit(lambda r, e, g: A.step_advantages(r, e, g, const_length=10.0))
    base = np.asarray(f(rewards, episodes, groups))
    np.testing.assert_allclose(np.asarray(f(rewards[perm], episodes[perm], groups[perm])), base[perm], rtol=1e-6)
    np.testing.assert_allclose(base, A.step_advantages(rewards, episodes, groups, const_length=10.0), rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_step_advantages_match_numpy_reference(data):
    n_groups = data.draw(st.integers(1, 3))
    rewards, episodes, groups = [], [], []
    ep = 0
    for g in range(n_groups):
        for _ in range(data.draw(st.integers(1, 4))):   # variable group sizes
            steps = data.draw(st.integers(1, 3))
            r = data.draw(st.sampled_from([0.0, 1.0, 0.25]))
            rewards += [r] * steps
            episodes += [ep] * steps
            groups += [g * 11] * steps
            ep += 1
    rewards, episodes, groups = np.array(rewards), np.array(episodes), np.array(groups)
    const = data.draw(st.sampled_from([None, 10.0]))
    # pad to a fixed 36 rows (one compile) with singleton groups, which must come out as exactly 0
    pad = 36 - len(rewards)
    got = np.asarray(A.step_advantages(np.pad(rewards, (0, pad), constant_values=1.0),
                                       np.concatenate([episodes, 1000 + np.arange(pad)]),
                                       np.concatenate([groups, 2000 + np.arange(pad)]), const_length=const))
    assert np.all(got[len(rewards):] == 0.0)
    got = got[:len(rewards)]
    want = ref.step_advantages(rewards, episodes, groups, const_length=const)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_reward_shaping_and_overlong_penalty():
    np.testing.assert_allclose(A.shape_rewards(np.array([1.0, -50.0]), reward_bias=-0.5, reward_scaling=2.0,
                                               reward_clip=20.0), [1.0, -20.0])
    pen = A.overlong_penalty(np.array([10, 12, 14, 20]), max_response_tokens=16, overlong_tokens=4,
                             overlong_penalty_factor=1.0)
    np.testing.assert_allclose(pen, [0.0, 0.0, -0.5, -2.0])


def test_placement_on_last_policy_token():
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    out = np.asarray(A.place_on_last_token(np.array([0.5, 9.0, -1.0]), mask))
    want = np.zeros((3, 6))
    want[0, 4] = 0.5
    want[2, 5] = -1.0
    np.testing.assert_array_equal(out, want)


def test_paper_path_every_policy_token_gets_step_advantage():
    rewards, episodes, groups = _group_of_eight(2, steps_success=2, steps_failure=4)
    rows = len(rewards)
    rng = np.random.default_rng(1)
    mask = np.zeros((rows, 12), np.int8)
    for b in range(rows):
        start, length = rng.integers(1, 5), rng.integers(1, 6)
        mask[b, start:start + length] = 1
    cfg = A.AdvantageConfig(step_adv_const_length=10.0)
    trace = A.compute_token_advantages(rewards, episodes, groups, mask, config=cfg)
    step = np.asarray(A.step_advantages(rewards, episodes, groups, const_length=10.0))
    np.testing.assert_allclose(np.asarray(trace.advantages), np.where(mask, step[:, None], 0.0), rtol=1e-5)
    np.testing.assert_allclose(trace.step_advantages, step, rtol=1e-6)
    np.testing.assert_allclose(
        trace.advantages, ref.grpo_token_advantages(rewards, episodes, groups, mask, const_length=10.0),
        rtol=1e-4, atol=1e-6)


def test_compute_token_advantages_jits_with_static_config():
    rewards, episodes, groups = _group_of_eight(3)
    mask = np.ones((len(rewards), 4), np.int8)
    cfg = A.AdvantageConfig()
    jitted = jax.jit(A.compute_token_advantages, static_argnames="config")(rewards, episodes, groups, mask,
                                                                          config=cfg)
    eager = A.compute_token_advantages(rewards, episodes, groups, mask, config=cfg)
    np.testing.assert_allclose(jitted.advantages, eager.advantages, rtol=1e-6)


@pytest.mark.parametrize("estimator", ["grpo", "batch", "liteppo"])
@pytest.mark.parametrize("const", [None, 10.0])
def test_padding_rows_marked_by_row_valid_change_no_advantage(estimator, const):
    """The trainer runs the path on its whole padded batch (one compiled shape whatever the real-row count): padding
    rows, even one with a real episode's id and a reward, leave every real row's advantage as the unpadded path's,
    batch-level estimators and 1/|τ| included."""
    rewards, episodes, groups = np.array([1.0, 1.0, 0.0, 0.5, 0.5, 0.5]), np.array([7, 7, 8, 9, 9, 9]), np.zeros(6)
    mask = np.array([[0, 1, 1]] * 6, np.int8)
    cfg = A.AdvantageConfig(estimator=estimator, step_adv_const_length=const)
    plain = A.compute_token_advantages(rewards, episodes, groups, mask, config=cfg).advantages
    padded = A.compute_token_advantages(np.r_[rewards, 5.0, 0.0], np.r_[episodes, 7, -1], np.r_[groups, 0, -1],
                                        np.r_[mask, np.zeros((2, 3), np.int8)], config=cfg,
                                        row_valid=np.arange(8) < 6).advantages
    assert np.abs(np.asarray(plain)).max() > 0.1
    np.testing.assert_allclose(np.asarray(padded), np.r_[np.asarray(plain), np.zeros((2, 3))], rtol=1e-6, atol=1e-7)


def test_kl_in_reward_k1_k2_k3():
    mask = np.array([[1, 1, 0]])
    lp = np.array([[-1.0, -2.0, -3.0]])
    ref_lp = np.array([[-1.5, -1.0, 0.0]])
    d = lp - ref_lp
    for name, est in [("k1", d), ("k2", d ** 2 / 2), ("k3", np.exp(-d) - 1 + d)]:
        out = A.kl_penalty_rewards(lp, ref_lp, mask, kl_ctl=0.1, estimator=name)
        np.testing.assert_allclose(out, np.where(mask, -0.1 * est, 0.0), rtol=1e-5)
    cfg = A.AdvantageConfig(estimator="raw", kl_ctl=0.1, kl_estimator="k2")
    trace = A.compute_token_advantages(np.array([1.0]), np.array([0]), np.array([0]), mask, config=cfg,
                                       logprobs=lp, ref_logprobs=ref_lp)
    kl_r = -0.1 * d[0, :2] ** 2 / 2
    np.testing.assert_allclose(np.asarray(trace.advantages)[0, :2], [kl_r.sum() + 1.0, kl_r[1] + 1.0], rtol=1e-5)


def test_estimator_registry_switches_recipes():
    r = np.array([1.0, 0.0, 0.0, 1.0, 0.5])
    g = np.array([0, 0, 0, 0, 1])
    valid = np.ones(5, bool)
    np.testing.assert_allclose(E.get_estimator("rloo")(r, g, valid), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.5], rtol=1e-5)
    np.testing.assert_allclose(E.get_estimator("drgrpo")(r, g, valid), [0.5, -0.5, -0.5, 0.5, 0.0], rtol=1e-5)
    np.testing.assert_allclose(E.get_estimator("fbc")(r, g, valid), [1, 0, 0, 1, 1])
    np.testing.assert_allclose(E.get_estimator("raw")(r, g, valid), r)
    np.testing.assert_allclose(E.get_estimator("grpo")(r, g, valid), [1, -1, -1, 1, 0], rtol=1e-4)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        E.get_estimator("nope")


def test_critic_truncation_and_adv_norm_in_the_full_path():
    mask = np.array([[1, 1], [1, 1]])
    cfg = A.AdvantageConfig(estimator="raw", discount=0.5, step_adv_const_length=1.0)
    trace = A.compute_token_advantages(np.array([1.0, 2.0]), np.array([0, 1]), np.array([0, 0]), mask,
                                       config=cfg, bootstrap_values=np.array([10.0, 0.0]),
                                       terminated=np.array([False, True]))
    np.testing.assert_allclose(trace.returns, [[0.5 * (1 + 5), 1 + 5], [1.0, 2.0]], rtol=1e-6)
    normed = A.compute_token_advantages(
        np.array([1.0, 2.0]), np.array([0, 1]), np.array([0, 0]), mask,
        config=dataclasses.replace(cfg, adv_norm=NormConfig("batch", "batch", std_unbiased=False)),
        bootstrap_values=np.array([10.0, 0.0]), terminated=np.array([False, True]))
    adv = np.asarray(normed.advantages)
    np.testing.assert_allclose([adv.mean(), adv.std()], [0.0, 1.0], atol=1e-4)


def test_turn_unit_path_and_lambda_function_config():
    mask = np.array([[0, 1, 1, 0, 1, 1]])
    turn_ids = np.array([[-1, 0, 0, -1, 1, 1]])
    cfg = A.AdvantageConfig(estimator="raw", gae_timestep_unit="turn", max_turns=3,
                            gae_lambda="relative_position", gae_lambda_kwargs=(("q", 0.5),),
                            step_adv_const_length=1.0)
    trace = A.compute_token_advantages(np.array([1.0]), np.array([0]), np.array([0]), mask, config=cfg,
                                       turn_ids=turn_ids)
    # two turns, λ = 0.5^(1/1); terminal reward 1 on turn 1; γ = 1, V = 0 -> turn0 gets λ? no: V = 0 so
    # A1 = 1, A0 = 0 + λ * 1 ... but with V = 0 the δ0 = 0 and A0 = γλ A1 = 0.5
    np.testing.assert_allclose(trace.advantages, [[0, 0.5, 0.5, 0, 1, 1]], rtol=1e-6)
    with pytest.raises(ValueError, match="max_turns"):
        A.AdvantageConfig(gae_timestep_unit="turn")


def test_gae_lambda_function_per_row_lengths_via_config():
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    cfg = A.AdvantageConfig(estimator="raw", gae_lambda="relative_position", gae_lambda_kwargs=(("q", 0.25),),
                            step_adv_const_length=1.0)
    trace = A.compute_token_advantages(np.array([1.0, 1.0]), np.array([0, 1]), np.array([0, 1]), mask, config=cfg)
    lam = np.asarray(gae.relative_position_lambda(np.array([3, 2]), q=0.25))
    want0 = ref.masked_gae(np.array([[0, 0, 1.0]]), np.ones((1, 3)), lam=lam[0])[0]
    np.testing.assert_allclose(np.asarray(trace.advantages)[0, :3], want0[0], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(trace.advantages)[0, 0], 0.25, rtol=1e-5)


def test_turn_unit_kl_penalty_stays_token_local():
    mask = np.array([[1, 1, 0, 1, 1]])
    turn_ids = np.array([[0, 0, -1, 1, 1]])
    lp = np.array([[-1.0, -2.0, 0.0, -1.0, -1.0]])
    ref_lp = np.array([[-1.5, -1.0, 0.0, -1.0, -2.0]])
    cfg = A.AdvantageConfig(estimator="raw", gae_timestep_unit="turn", max_turns=2, kl_ctl=0.1,
                            step_adv_const_length=1.0)
    trace = A.compute_token_advantages(np.array([1.0]), np.array([0]), np.array([0]), mask, config=cfg,
                                       turn_ids=turn_ids, logprobs=lp, ref_logprobs=ref_lp)
    kl = np.where(mask, -0.1 * (lp - ref_lp), 0.0)
    # both turns get the terminal reward 1 (γ = λ = 1, V = 0); the KL term is added per token, not summed per turn
    np.testing.assert_allclose(trace.advantages, np.where(mask, 1.0, 0.0) + kl, rtol=1e-5, atol=1e-7)


_jit_path = jax.jit(A.compute_token_advantages, static_argnames="config")


@settings(max_examples=20, deadline=None)
@given(data=st.data(), const=st.sampled_from([None, 10.0]))
def test_paper_path_matches_numpy_reference(data, const):
    """Random groups/episodes/masks in a fixed [24, 10] block (one compile per const); padded rows are
    singleton groups without policy tokens and must stay exactly 0."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    rewards, episodes, groups = [], [], []
    for g in range(int(rng.integers(1, 4))):
        for _ in range(int(rng.integers(1, 5))):
            steps = int(rng.integers(1, 3))
            rewards += [float(rng.random() < 0.5)] * steps
            episodes += [len(set(episodes)) + 100] * steps
            groups += [g] * steps
    rows = len(rewards)
    mask = (rng.random((rows, 10)) < 0.6).astype(np.int8)
    pad = 24 - rows
    cfg = A.AdvantageConfig(step_adv_const_length=const)
    got = np.asarray(_jit_path(np.pad(np.array(rewards), (0, pad)),
                               np.concatenate([episodes, 5000 + np.arange(pad)]),
                               np.concatenate([groups, 9000 + np.arange(pad)]),
                               np.pad(mask, [(0, pad), (0, 0)]), config=cfg).advantages)
    want = ref.grpo_token_advantages(np.array(rewards), np.array(episodes), np.array(groups), mask,
                                     const_length=const)
    np.testing.assert_allclose(got[:rows], want, rtol=1e-4, atol=1e-6)
    assert np.all(got[rows:] == 0.0)


def test_step_advantages_contract_signature():
    import inspect

    sig = inspect.signature(A.step_advantages)
    assert list(sig.parameters)[:3] == ["rewards", "episode_ids", "group_ids"]
    assert {k: p.default for k, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY} == dict(
        const_length=None, std_unbiased=False, eps=1e-5)
    out = A.step_advantages(np.array([1.0, 0.0]), np.array([0, 1]), np.array([0, 0]))
    assert out.dtype == np.float32 and out.shape == (2,)
