"""Losses: hand-computed cases, gradient flow, padding/repacking invariance, ratio 1, NumPy-reference properties."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxwebrl.rl import aggregation, losses, regularizers
from jaxwebrl.rl.rejection import RejectionConfig
from tests.rl import numpy_reference as ref


def _grad_lp(fn, lp, *args, **kw):
    return np.asarray(jax.grad(lambda x: fn(x, *args, **kw)[0])(jnp.asarray(lp, jnp.float32)))


def _random_batch(seed, batch=3, time=6, spread=0.3):
    rng = np.random.default_rng(seed)
    lp = -rng.random((batch, time)) - 0.1
    prox = lp + spread * rng.normal(size=(batch, time))
    behave = prox + spread * rng.normal(size=(batch, time))
    adv = rng.normal(size=(batch, time))
    mask = rng.random((batch, time)) < 0.75
    mask[:, 0] = True
    return [a.astype(np.float32) for a in (lp, prox, behave, adv)] + [mask]


def test_contract_signature():
    sig = inspect.signature(losses.ppo_actor_loss)
    assert list(sig.parameters)[:5] == ["logprobs", "prox_logprobs", "behave_logprobs", "advantages", "loss_mask"]
    assert {k: p.default for k, p in sig.parameters.items() if p.kind == p.KEYWORD_ONLY} == dict(
        eps_clip=0.2, eps_clip_higher=None, c_clip=None, behav_imp_weight_cap=None)


def test_ppo_clip_asymmetric_hand_computed():
    lp = np.log(np.array([[1.5, 1.5, 0.5, 0.5]]))
    zeros = np.zeros((1, 4))
    adv = np.array([[1.0, -1.0, 1.0, -1.0]])
    mask = np.ones((1, 4))
    loss, stats = losses.ppo_actor_loss(lp, zeros, zeros, adv, mask, eps_clip=0.2, eps_clip_higher=0.28)
    # A>0, ρ=1.5 -> clipped to 1.28; A<0, ρ=1.5 -> unclipped 1.5; A>0, ρ=.5 -> unclipped .5;
    # A<0, ρ=.5 -> clipped to .8
    np.testing.assert_allclose(loss, (-1.28 + 1.5 - 0.5 + 0.8) / 4, rtol=1e-5)
    np.testing.assert_allclose(stats["clip_ratio"], 0.5)
    np.testing.assert_allclose(_grad_lp(losses.ppo_actor_loss, lp, zeros, zeros, adv, mask, eps_clip_higher=0.28),
                               [[0, 1.5 / 4, -0.5 / 4, 0]], rtol=1e-5)


def test_dual_clip_caps_negative_advantage_loss_at_c_abs_a():
    lp = np.log(np.array([[5.0, 5.0, 2.0]]))
    zeros = np.zeros((1, 3))
    adv = np.array([[-2.0, 2.0, -2.0]])
    loss, stats = losses.ppo_actor_loss(lp, zeros, zeros, adv, np.ones((1, 3)), c_clip=3.0)
    # token 0: -A ρ = 10 > 3|A| = 6 -> 6 (no gradient); token 1: A>0 clipped, -2*1.2; token 2: 4 < 6 stays
    np.testing.assert_allclose(loss, (6.0 - 2.4 + 4.0) / 3, rtol=1e-5)
    np.testing.assert_allclose(stats["dual_clip_ratio"], 1 / 3, rtol=1e-6)
    g = _grad_lp(losses.ppo_actor_loss, lp, zeros, zeros, adv, np.ones((1, 3)), c_clip=3.0)
    np.testing.assert_allclose(g, [[0.0, 0.0, 2.0 * 2.0 / 3]], rtol=1e-5)
    with pytest.raises(ValueError, match="c_clip"):
        losses.ppo_actor_loss(lp, zeros, zeros, adv, np.ones((1, 3)), c_clip=1.0)


def test_behaviour_weight_and_dropping_cap_keep_denominator():
    lp = np.zeros((1, 4))
    prox = np.zeros((1, 4))
    behave = np.log(np.array([[1.0, 0.5, 0.1, 1.0]]))  # w = [1, 2, 10, 1]
    adv = np.ones((1, 4))
    mask = np.array([[1, 1, 1, 0]])
    loss, stats = losses.ppo_actor_loss(lp, prox, behave, adv, mask)
    np.testing.assert_allclose(loss, -(1 + 2 + 10) / 3, rtol=1e-5)
    assert float(stats["behave_cap_ratio"]) == 0.0
    capped, stats = losses.ppo_actor_loss(lp, prox, behave, adv, mask, behav_imp_weight_cap=5.0)
    np.testing.assert_allclose(capped, -(1 + 2) / 3, rtol=1e-5)    # token 2 dropped, still counted in /3
    np.testing.assert_allclose(stats["behave_cap_ratio"], 1 / 3, rtol=1e-6)
    # the behaviour-gap stats average over the tokens that keep their weight (AReaL's behave_mask), not the dropped
    np.testing.assert_allclose(stats["behave_approx_kl"], np.mean(-np.log([1.0, 0.5])), rtol=1e-5)
    np.testing.assert_allclose(stats["behave_imp_weight"], 1.5, rtol=1e-5)
    g = _grad_lp(losses.ppo_actor_loss, lp, prox, behave, adv, mask, behav_imp_weight_cap=5.0)
    np.testing.assert_allclose(g, [[-1 / 3, -2 / 3, 0.0, 0.0]], rtol=1e-5)


def test_gspo_sequence_ratio_is_geometric_mean():
    lp = np.log(np.array([[4.0, 1.0, 7.0]]))
    ratio = losses.sequence_ratio(lp, np.zeros((1, 3)), np.array([[1, 1, 0]]))
    np.testing.assert_allclose(ratio, [2.0], rtol=1e-6)
    np.testing.assert_allclose(np.exp(losses.sequence_log_ratio(lp, np.zeros((1, 3)), np.array([[1, 1, 0]]),
                                                                mode="sum")), [4.0], rtol=1e-6)


def test_gspo_and_gspo_token_agree_under_uniform_advantages():
    lp, prox, _, _, mask = _random_batch(1, spread=0.01)
    behave = prox  # coupled: a per-token behaviour weight would (rightly) break the equality
    adv = np.repeat(np.array([[1.5], [-0.5], [2.0]], np.float32), lp.shape[1], axis=1)
    for agg in ("seq-mean-token-mean", "token-mean"):
        kw = dict(eps_clip=0.2, eps_clip_higher=0.2, agg_mode=agg)
        out = []
        for name in ("gspo", "gspo_token"):
            fn = losses.get_loss(name)
            out.append(jax.value_and_grad(lambda x: fn(x, prox, behave, adv, mask, **kw)[0])(jnp.asarray(lp)))
        (l1, g1), (l2, g2) = out
        np.testing.assert_allclose(l1, l2, rtol=1e-5)
        np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-7)
        assert np.abs(np.asarray(g1)).max() > 0


def test_gspo_token_keeps_local_credit():
    zeros = np.zeros((1, 2))
    adv = np.array([[1.0, -2.0]])
    g = _grad_lp(losses.get_loss("gspo_token"), zeros, zeros, zeros, adv, np.ones((1, 2)))
    np.testing.assert_allclose(g, [[-0.5, 1.0]], rtol=1e-6)


def test_sapo_gates_and_gradients():
    zeros = np.zeros((1, 2))
    adv = np.array([[2.0, -3.0]])
    mask = np.ones((1, 2))
    g = _grad_lp(losses.sapo_loss, zeros, zeros, zeros, adv, mask, tau_pos=1.0, tau_neg=5.0)
    np.testing.assert_allclose(g, [[-1.0, 1.5]], rtol=1e-6)           # gate is exactly 1 at ratio 1
    _, stats = losses.sapo_loss(zeros, zeros, zeros, adv, mask, tau_pos=1.0, tau_neg=5.0)
    np.testing.assert_allclose(stats["sapo_gate"], 1.0)
    lp = np.log(np.full((1, 2), 1.5))
    g = _grad_lp(losses.sapo_loss, lp, zeros, zeros, adv, mask, tau_pos=1.0, tau_neg=5.0)
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    gate = lambda tau: 4 * sig(tau * 0.5) * (1 - sig(tau * 0.5))  # noqa: E731
    np.testing.assert_allclose(g, [[-2 * 1.5 * gate(1.0) / 2, 3 * 1.5 * gate(5.0) / 2]], rtol=1e-5)
    assert abs(g[0, 1]) / 3 < abs(g[0, 0]) / 2   # the sharper negative temperature damps faster


def test_cispo_every_token_keeps_gradient_with_clipped_weight():
    lp = np.log(np.array([[2.0, 1.0, 0.5]]))
    zeros = np.zeros((1, 3))
    adv = np.array([[1.0, -1.0, 1.0]])
    g = _grad_lp(losses.cispo_loss, lp, zeros, zeros, adv, np.ones((1, 3)), eps_clip_higher=0.28)
    np.testing.assert_allclose(g, [[-1.28 / 3, 1.0 / 3, -0.5 / 3]], rtol=1e-5)
    _, stats = losses.cispo_loss(lp, zeros, zeros, adv, np.ones((1, 3)))
    np.testing.assert_allclose(stats["clip_ratio"], 1 / 3, rtol=1e-6)


def test_sao_double_sided_open_interval_and_detach_switch():
    behave = np.zeros((1, 4))
    lp = np.log(np.array([[1.0, 0.8, 1.1, 1.3]])).astype(np.float32)   # 0.8 sits on the lower boundary
    adv = np.ones((1, 4))
    mask = np.ones((1, 4))
    _, stats = losses.sao_loss(lp, behave, behave, adv, mask, eps_clip=0.2, eps_clip_higher=0.2)
    ratio = np.exp(lp)
    trusted = (ratio > 0.8) & (ratio < 1.2)
    np.testing.assert_allclose(stats["rejection_ratio"], 1 - trusted.mean(), rtol=1e-6)
    g = _grad_lp(losses.sao_loss, lp, behave, behave, adv, mask)
    np.testing.assert_allclose(g, np.where(trusted, -ratio / 4, 0.0), rtol=1e-5)
    g_lit = _grad_lp(losses.sao_loss, lp, behave, behave, adv, mask, detach_ratio=False)
    np.testing.assert_allclose(g_lit, np.where(trusted, -ratio * (1 + lp) / 4, 0.0), rtol=1e-4, atol=1e-7)


def test_fbc_filters_failures_out_of_the_minibatch():
    zeros = np.zeros((2, 2))
    adv = np.array([[0.5, 0.5], [0.0, 0.0]])           # "fbc" estimator: successes 1/T_e, failures 0
    loss, stats = losses.fbc_loss(zeros, zeros, zeros, adv, np.ones((2, 2)))
    np.testing.assert_allclose(loss, -0.5, rtol=1e-6)   # mean over the 2 success tokens only
    np.testing.assert_allclose(stats["n_valid_tokens"], 2.0)


def test_icepop_and_kpop_rejection():
    zeros = np.zeros((1, 4))
    behave = np.log(np.array([[1.0, 0.1, 4.0, 1.0]]))   # w = [1, 10, 0.25, 1]
    adv = np.ones((1, 4))
    mask = np.ones((1, 4))
    loss, stats = losses.get_loss("icepop")(zeros, zeros, behave, adv, mask)   # keep w in [0.5, 5]
    np.testing.assert_allclose(loss, -(1 + 1) / 4, rtol=1e-5)
    np.testing.assert_allclose(stats["rejection_ratio"], 0.5)
    clamp = RejectionConfig(metric="ratio", action="clamp", lower=0.5, upper=5.0)
    loss, stats = losses.decoupled_ppo_loss(zeros, zeros, behave, adv, mask, rejection=clamp)
    np.testing.assert_allclose(loss, -(1 + 5 + 0.5 + 1) / 4, rtol=1e-5)
    seq = RejectionConfig(metric="ratio", level="sequence", lower=0.5, upper=5.0)  # geo-mean 2.5^.25 -> kept
    loss, _ = losses.decoupled_ppo_loss(zeros, zeros, behave, adv, mask, rejection=seq)
    np.testing.assert_allclose(loss, -(2.5 ** 0.25), rtol=1e-5)   # every token weighs the sequence's geometric mean
    lp_prox = np.log(np.array([[0.5, 0.9, 0.5, 0.5]]))
    lp_behave = np.log(np.array([[0.5, 0.01, 0.5, 0.5]]))
    _, stats = losses.get_loss("kpop")(lp_prox, lp_prox, lp_behave, adv, mask, rejection=RejectionConfig(
        metric="binary_kl", upper=1.0))
    np.testing.assert_allclose(stats["rejection_ratio"], 0.25)
    with pytest.raises(ValueError, match="clamp"):
        RejectionConfig(metric="binary_kl", action="clamp")


def test_aggregation_modes_hand_computed():
    per_token = np.array([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    np.testing.assert_allclose(aggregation.aggregate(per_token, mask, "token-mean"), 7 / 4)
    np.testing.assert_allclose(aggregation.aggregate(per_token, mask, "seq-mean-token-mean"), (1 + 4) / 2)
    np.testing.assert_allclose(aggregation.aggregate(per_token, mask, "seq-mean-token-sum-norm", normalizer=10),
                               (0.3 + 0.4) / 2)
    segs = np.array([[0, 0, 1], [0, 0, 0]])          # row 0 packs two sequences
    np.testing.assert_allclose(aggregation.aggregate(per_token, mask, "seq-mean-token-mean", segment_ids=segs),
                               (1.5 + 0 + 4) / 3)


ALL = losses.loss_names()


@pytest.mark.parametrize("name", ALL)
def test_no_gradient_reaches_evidence_and_masked_tokens_get_none(name):
    lp, prox, behave, adv, mask = _random_batch(3)
    mask[1, 2] = False
    adv[1, 2] = 1e30            # a masked token with a huge advantage and garbage log-probs
    lp[1, 2] = 50.0
    prox[1, 2] = -1e4
    fn = losses.get_loss(name)
    kw = {"agg_normalizer": 8.0} if name == "drgrpo" else {}

    def total(lp, prox, behave, adv):
        return fn(lp, prox, behave, adv, mask, **kw)

    (loss, stats), grads = jax.value_and_grad(total, argnums=(0, 1, 2, 3), has_aux=True)(
        *(jnp.asarray(a) for a in (lp, prox, behave, adv)))
    for g in grads[1:]:
        assert np.all(np.asarray(g) == 0.0)
    g_lp = np.asarray(grads[0])
    assert np.all(np.isfinite(g_lp))
    assert g_lp[1, 2] == 0.0
    assert np.all(g_lp[~mask] == 0.0)
    assert np.isfinite(float(loss))
    assert set(losses.STAT_KEYS) <= set(stats)
    assert all(np.asarray(v).dtype == np.float32 and np.asarray(v).shape == () for v in stats.values())


@pytest.mark.parametrize("name", ALL)
def test_padding_and_repacking_leave_loss_unchanged(name):
    lp, prox, behave, adv, mask = _random_batch(4)
    fn = losses.get_loss(name)
    kw = {"agg_normalizer": 8.0} if name == "drgrpo" else {}
    base, _ = fn(lp, prox, behave, adv, mask, **kw)
    perm = np.array([2, 0, 1])
    pad = lambda a, v: np.pad(a[perm], [(0, 2), (0, 3)], constant_values=v)  # noqa: E731
    padded, _ = fn(pad(lp, 7.0), pad(prox, -3.0), pad(behave, 9.0), pad(adv, 1e6), pad(mask, False), **kw)
    np.testing.assert_allclose(padded, base, rtol=1e-5, atol=1e-6)


def _tiny_policy_logprobs(params, tokens):
    logits = params[tokens[:, :-1]]                    # bigram table [V, V]
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def test_ratio_exactly_one_before_any_update():
    params = jax.random.normal(jax.random.PRNGKey(0), (11, 11))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 9), 0, 11)
    mask = np.ones((4, 9), bool)
    mask[:, :3] = False
    behave = np.asarray(_tiny_policy_logprobs(params, tokens))          # what the sampler recorded
    prox = np.asarray(jax.jit(_tiny_policy_logprobs)(params, tokens))   # recomputed, same weights
    adv = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (4, 9)))

    def objective(p):
        return losses.ppo_actor_loss(_tiny_policy_logprobs(p, tokens), prox, behave, adv, mask,
                                     c_clip=3.0, behav_imp_weight_cap=5.0)

    loss, stats = objective(params)
    assert float(stats["importance_weight"]) == 1.0
    assert float(stats["clip_ratio"]) == 0.0 and float(stats["behave_cap_ratio"]) == 0.0
    assert float(stats["approx_kl_abs"]) == 0.0
    np.testing.assert_allclose(loss, -(adv * mask).sum() / mask.sum(), rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), eps_hi=st.sampled_from([None, 0.28]), c_clip=st.sampled_from([None, 3.0]),
       cap=st.sampled_from([None, 2.0]))
def test_ppo_actor_loss_and_gradient_match_numpy_reference(seed, eps_hi, c_clip, cap):
    lp, prox, behave, adv, mask = _random_batch(seed, batch=4, time=8, spread=0.4)
    kw = dict(eps_clip=0.2, eps_clip_higher=eps_hi, c_clip=c_clip, behav_imp_weight_cap=cap)
    loss, grad = jax.value_and_grad(lambda x: losses.ppo_actor_loss(x, prox, behave, adv, mask, **kw)[0])(
        jnp.asarray(lp))
    want_loss, want_grad = ref.ppo_actor_loss_and_grad(lp, prox, behave, adv, mask, **kw)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)


def test_contract_is_jittable_and_accepts_numpy():
    lp, prox, behave, adv, mask = _random_batch(5)
    f = jax.jit(lambda *a: losses.ppo_actor_loss(*a, c_clip=3.0, behav_imp_weight_cap=5.0))
    l1, s1 = f(lp, prox, behave, adv, mask)
    l2, s2 = losses.ppo_actor_loss(lp, prox, behave, adv, mask, c_clip=3.0, behav_imp_weight_cap=5.0)
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    assert l1.dtype == jnp.float32


def test_registry_and_errors():
    assert {"ppo", "grpo", "drgrpo", "gspo", "gspo_token", "sapo", "cispo", "fbc", "sao", "icepop", "kpop"} <= set(ALL)
    with pytest.raises(ValueError, match="unknown loss"):
        losses.get_loss("nope")
    assert "tau_neg" in losses.loss_kwarg_names("sapo")
    assert "behav_imp_weight_cap" in losses.loss_kwarg_names("ppo")
    lp, prox, behave, adv, mask = _random_batch(6)
    with pytest.raises(ValueError, match="advantages shape"):
        losses.ppo_actor_loss(lp, prox, behave, adv[:, :2], mask)


def test_kl_and_combined_objective():
    lp = np.array([[-1.0, -2.0]])
    ref_lp = np.array([[-1.5, -1.0]])
    mask = np.ones((1, 2))
    kl, stats = regularizers.kl_loss(lp, ref_lp, mask, estimator="k2")
    np.testing.assert_allclose(kl, np.mean((lp - ref_lp) ** 2 / 2), rtol=1e-6)
    zeros = np.zeros((1, 2))
    total, stats = regularizers.actor_objective("ppo", lp, lp, lp, zeros, mask, ref_logprobs=ref_lp, kl_coef=0.5,
                                                kl_estimator="k2")
    np.testing.assert_allclose(total, 0.5 * float(kl), rtol=1e-5)
    assert {"kl", "policy_loss"} <= set(stats)
    g = jax.grad(lambda x: regularizers.actor_objective("ppo", x, lp, lp, zeros, mask, ref_logprobs=ref_lp,
                                                        kl_coef=1.0, kl_estimator="k1")[0])(
        jnp.asarray(lp, jnp.float32))
    np.testing.assert_allclose(g, [[0.5, 0.5]], rtol=1e-6)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        regularizers.actor_objective("ppo", lp, lp, lp, zeros, mask, kl_coef=0.5)


@pytest.mark.parametrize("name, loss_kwargs, mode, normalizer", [
    ("gspo", (), "seq-mean-token-mean", None),                                   # the recipe's own mode
    ("drgrpo", (("agg_normalizer", 64.0),), "seq-mean-token-sum-norm", 64.0),
    ("ppo", (("agg_mode", "seq-mean-token-mean"),), "seq-mean-token-mean", None),  # actor.agg_mode override
    ("ppo", (), "token-mean", None)])
def test_kl_loss_term_aggregates_like_the_loss_it_is_added_to(name, loss_kwargs, mode, normalizer):
    """Rows of 1 and 4 policy tokens: the KL term is aggregated with the loss's agg_mode / agg_normalizer (veRL's
    use_kl_loss), not always by token mean (which weighs the long row 4x in a sequence-mean loss)."""
    lp = np.array([[-1.0, -2.0, -0.5, -1.5], [-0.2, -3.0, -3.0, -3.0]], np.float32)
    ref_lp = np.array([[-1.5, -1.0, -0.7, -1.0], [-1.2, -3.0, -3.0, -3.0]], np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
    zeros = np.zeros_like(lp)
    total, stats = regularizers.actor_objective(name, lp, lp, lp, zeros, mask, loss_kwargs=loss_kwargs,
                                                ref_logprobs=ref_lp, kl_coef=1.0, kl_estimator="k1")
    expected = aggregation.aggregate(np.where(mask > 0, lp - ref_lp, 0.0), mask, mode, normalizer=normalizer)
    np.testing.assert_allclose(float(stats["kl"]), float(expected), rtol=1e-6)
    np.testing.assert_allclose(float(total), float(expected), rtol=1e-6)   # zero advantages: the KL term alone


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "ppo"])
def test_repacking_two_sequences_into_one_row_with_segment_ids(name):
    lp, prox, behave, adv, mask = _random_batch(7, batch=2, time=5, spread=0.05)
    mask[:] = True
    fn = losses.get_loss(name)
    kw = dict(agg_mode="seq-mean-token-mean", eps_clip=0.2, eps_clip_higher=0.2)
    base, _ = fn(lp, prox, behave, adv, mask, **kw)
    packed = [np.concatenate([a[0], a[1]])[None] for a in (lp, prox, behave, adv, mask)]
    segs = np.repeat([0, 1], 5)[None]
    repacked, _ = fn(*packed, segment_ids=segs, **kw)
    np.testing.assert_allclose(repacked, base, rtol=1e-5)
    g_base = _grad_lp(fn, lp, prox, behave, adv, mask, **kw)
    g_packed = _grad_lp(fn, packed[0], *packed[1:], segment_ids=segs, **kw)
    np.testing.assert_allclose(g_packed[0], np.concatenate([g_base[0], g_base[1]]), rtol=1e-5, atol=1e-8)


def test_sequence_level_kl_rejection_with_max_aggregation():
    prox = np.log(np.array([[0.5, 0.5], [0.5, 0.5]]))
    behave = np.log(np.array([[0.5, 0.05], [0.5, 0.4]]))   # row 0 has one very stale token
    adv = np.ones((2, 2))
    mask = np.ones((2, 2))
    cfg = RejectionConfig(metric="kl_k3", level="sequence", agg="max", upper=0.5)
    loss, stats = losses.decoupled_ppo_loss(prox, prox, behave, adv, mask, rejection=cfg)
    np.testing.assert_allclose(stats["rejection_ratio"], 0.5)          # the whole first row goes
    np.testing.assert_allclose(loss, -(1.0 + 0.5 / 0.4) / 4, rtol=1e-5)
