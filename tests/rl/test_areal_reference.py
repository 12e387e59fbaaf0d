"""jaxwebrl.rl against AReaL's semantics on randomized inputs.

Each reference below is written here, in float64 NumPy, from the published formulas of the AReaL function its
docstring names (areal/utils/functional/functional.py, areal/trainer/ppo/actor.py); it shares no code with
jaxwebrl.rl. Where jaxwebrl deliberately differs, the test says so.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwebrl.rl import advantages as A
from jaxwebrl.rl import losses
from jaxwebrl.rl.normalization import NormConfig, normalize
from jaxwebrl.rl.rejection import RejectionConfig
from tests.rl.test_losses import _random_batch


def _batch(seed, batch=4, time=8, spread=0.4):
    return _random_batch(seed, batch=batch, time=time, spread=spread)


# ------------------------------------------------------------------------------------------- references


def areal_apply_rejection_sampling(prox, old, mask, *, metric, level, action, lower, upper, agg):
    """AReaL `apply_rejection_sampling` (2-D padded branch): (updated loss_mask, behave_imp_weight, filtered)."""
    prox, old = np.float64(prox), np.float64(old)
    log_ratio = prox - old
    log_ratio = np.where(np.isfinite(log_ratio), log_ratio, 0.0)
    if metric == "ratio":
        value = np.exp(log_ratio)
    elif metric == "kl_k1":
        value = log_ratio
    elif metric == "kl_k2":
        value = log_ratio ** 2 / 2
    else:
        value = np.exp(-log_ratio) - 1 + log_ratio

    def check(m):
        return (m <= upper) if lower is None else ((m >= lower) & (m <= upper))

    weight = np.exp(log_ratio)
    original = weight
    in_bounds = np.ones(mask.shape, bool)
    if level == "sequence":
        agg_values = log_ratio if metric == "ratio" else value
        masked = np.where(mask, agg_values, 0.0)
        count = np.maximum(mask.sum(-1, keepdims=True), 1)
        if metric == "ratio":  # the geometric mean is every token's weight
            weight = np.broadcast_to(np.exp(masked.sum(-1, keepdims=True) / count), mask.shape)
            original = weight
        if agg == "sum":
            seq = masked.sum(-1, keepdims=True)
        elif agg == "mean":
            seq = masked.sum(-1, keepdims=True) / count
        else:
            seq = np.where(mask, agg_values, -np.inf).max(-1, keepdims=True)
            seq = np.where(mask.sum(-1, keepdims=True) == 0, 0.0, seq)
        seq_metric = np.exp(seq) if metric == "ratio" else seq
        if action == "mask":
            in_bounds = np.broadcast_to(check(seq_metric), mask.shape)
        else:
            out = np.broadcast_to(~check(seq_metric), mask.shape)
            weight = np.where(out, np.clip(weight, 0.0 if lower is None else lower, upper), weight)
    elif action == "mask":
        in_bounds = check(value)
    else:
        weight = np.clip(weight, 0.0 if lower is None else lower, upper)
    if action == "mask":
        new_mask = mask & in_bounds
        filtered = (mask & ~in_bounds).sum() / max(mask.sum(), 1)
    else:
        new_mask = mask
        filtered = (mask & (original != weight)).sum() / max(mask.sum(), 1)
    return new_mask, np.where(new_mask, weight, 0.0), filtered


def areal_ppo_actor_loss_fn(lp, prox, old, adv, mask, *, eps_clip, eps_clip_higher=None, c_clip=None,
                            rejection=None):
    """AReaL `ppo_actor_loss_fn` (token level, decoupled, with `rejection_sampling`): loss, d loss / d logprobs, and
    the behaviour statistics over `behave_mask`. eps_clip=None is the unclipped surrogate -A·ρ (M2PO's objective)."""
    lp, prox, old, adv = (np.float64(a) for a in (lp, prox, old, adv))
    count = max(mask.sum(), 1)                       # the original count: rejected tokens stay in the denominator
    weight = np.exp(prox - old)
    if rejection is not None:
        mask, weight, filtered = areal_apply_rejection_sampling(prox, old, mask, **rejection)
    else:
        filtered = 0.0
    ratio = np.where(mask, np.exp(lp - prox), 0.0)
    pg1 = -adv * ratio
    if eps_clip is None:
        pg, ratio_branch = pg1, np.ones(mask.shape, bool)
    else:
        hi = eps_clip if eps_clip_higher is None else eps_clip_higher
        pg2 = -adv * np.clip(ratio, 1 - eps_clip, 1 + hi)
        pg, ratio_branch = np.maximum(pg1, pg2), pg1 >= pg2
    dual = np.zeros(mask.shape, bool)
    if c_clip is not None:
        pg3 = np.sign(adv) * c_clip * adv
        dual = pg3 < pg
        pg = np.minimum(pg, pg3)
    behave_mask = (weight > 0) & mask
    loss = np.where(mask, pg * weight, 0.0).sum() / count
    grad = np.where(mask & ratio_branch & ~dual, -adv * ratio * weight, 0.0) / count
    n_behave = max(behave_mask.sum(), 1)
    stats = dict(behave_approx_kl=np.where(behave_mask, prox - old, 0.0).sum() / n_behave,
                 behave_imp_weight=np.where(behave_mask, weight, 0.0).sum() / n_behave,
                 rejection_ratio=filtered)
    return loss, grad, stats


def areal_m2po_loss_mask(old, prox, mask, m2_threshold):
    """AReaL `_apply_m2po_masking` + `_get_m2po_loss_mask`: mask the largest (old - prox)² until the mean of the
    rest is below the threshold (all but one when no suffix gets there)."""
    m2 = (np.float64(old) - np.float64(prox)) ** 2
    selected = m2[mask]
    if selected.size == 0:
        return mask
    order = np.argsort(-selected, kind="stable")
    ordered = selected[order]
    suffix_mean = np.cumsum(ordered[::-1])[::-1] / np.arange(len(ordered), 0, -1)
    below = np.flatnonzero(suffix_mean < m2_threshold)
    n_masked = below[0] if below.size else len(ordered) - 1
    keep_sorted = np.arange(len(ordered)) >= n_masked
    keep = np.empty(len(ordered), bool)
    keep[order] = keep_sorted
    out = np.zeros(mask.shape, bool)
    out[mask] = keep
    return out


def areal_reward_overlong_penalty(lengths, *, overlong_tokens, overlong_penalty_factor, max_response_length):
    """AReaL `reward_overlong_penalty` (from VERL's DAPO): the penalty added to one response's reward."""
    expected = max_response_length - overlong_tokens
    return np.array([min(-(n - expected) / overlong_tokens * overlong_penalty_factor, 0.0) for n in lengths])


def areal_gspo_ppo_actor_loss_fn(lp, prox, old, adv, mask, *, eps_clip, eps_clip_higher):
    """AReaL `ppo_actor_loss_fn` with importance_sampling_level="sequence": `_compute_sequence_level_ratio_and_
    advantages` (geometric-mean ratio and mean advantage per sequence, 2-D branch), clip, behaviour weight, token
    mean over the minibatch. Returns the loss."""
    lp, prox, old, adv = (np.float64(a) for a in (lp, prox, old, adv))
    count = np.maximum(mask.sum(-1, keepdims=True), 1)
    ratio = np.where(mask, np.exp(np.where(mask, lp - prox, 0.0).sum(-1, keepdims=True) / count), 0.0)
    adv = np.where(mask, np.where(mask, adv, 0.0).sum(-1, keepdims=True) / count, 0.0)
    pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps_clip, 1 + eps_clip_higher)) * np.exp(prox - old)
    return np.where(mask, pg, 0.0).sum() / max(mask.sum(), 1)


def areal_sapo_loss_fn(lp, old, adv, mask, *, tau_pos, tau_neg):
    """AReaL `sapo_loss_fn` (token level): -(4/τ)·σ(τ(ρ - 1))·A with τ by the sign of A, token mean."""
    ratio = np.exp(np.float64(lp) - old)
    tau = np.where(adv > 0, tau_pos, tau_neg)
    gate = 4.0 / tau / (1.0 + np.exp(-tau * (ratio - 1.0)))
    return np.where(mask, -gate * adv, 0.0).sum() / max(mask.sum(), 1)


def _ours(lp, prox, behave, adv, mask, **kw):
    def loss_fn(x):
        return losses.decoupled_ppo_loss(x, prox, behave, adv, mask, **kw)
    (loss, stats), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(lp))
    return float(loss), np.asarray(grad), {k: float(v) for k, v in stats.items()}


# ------------------------------------------------------------------------------------------ the tests


REJECTIONS = [
    dict(metric="ratio", level="token", action="mask", lower=0.5, upper=2.0, agg="mean"),
    dict(metric="ratio", level="token", action="clamp", lower=0.5, upper=2.0, agg="mean"),
    dict(metric="ratio", level="sequence", action="mask", lower=0.9, upper=1.1, agg="mean"),
    dict(metric="ratio", level="sequence", action="clamp", lower=0.9, upper=1.1, agg="mean"),
    dict(metric="ratio", level="sequence", action="mask", lower=None, upper=1.5, agg="sum"),
    dict(metric="ratio", level="sequence", action="mask", lower=None, upper=2.0, agg="max"),
    dict(metric="kl_k3", level="sequence", action="mask", lower=None, upper=0.08, agg="mean"),
    dict(metric="kl_k2", level="token", action="mask", lower=None, upper=0.05, agg="mean"),
]


@pytest.mark.parametrize("rejection", REJECTIONS, ids=lambda r: f"{r['metric']}-{r['level']}-{r['action']}-{r['agg']}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_sampling_matches_areal(rejection, seed):
    """AReaL `apply_rejection_sampling` inside `ppo_actor_loss_fn`: loss, gradient, the fraction rejected or clamped,
    and behave_approx_kl / behave_imp_weight over the kept tokens (AReaL's behave_mask). At sequence level the ratio
    metric weighs every token by the sequence's geometric-mean weight."""
    lp, prox, behave, adv, mask = _batch(seed)
    kw = dict(eps_clip=0.2, eps_clip_higher=0.28, c_clip=3.0)
    loss, grad, stats = _ours(lp, prox, behave, adv, mask, rejection=RejectionConfig(**rejection), **kw)
    want_loss, want_grad, want = areal_ppo_actor_loss_fn(lp, prox, behave, adv, mask, rejection=rejection, **kw)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    for key in ("behave_approx_kl", "behave_imp_weight", "rejection_ratio"):
        np.testing.assert_allclose(stats[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_sequence_ratio_rejection_uses_the_geometric_mean_weight():
    """AReaL `apply_rejection_sampling`, level="sequence", metric="ratio": token weights [2, 0.5] with A = 1 weigh
    as their geometric mean 1 each (loss -1.00), not -1.25 as per-token weights would give; out of bounds, the
    clamp applies to that mean."""
    zeros = np.zeros((1, 2), np.float32)
    behave = np.log(np.array([[0.5, 2.0]], np.float32))     # w = [2, 0.5]
    ones = np.ones((1, 2), np.float32)
    keep = RejectionConfig(metric="ratio", level="sequence", action="mask", lower=0.5, upper=2.0)
    loss, _ = losses.decoupled_ppo_loss(zeros, zeros, behave, ones, ones, rejection=keep)
    np.testing.assert_allclose(loss, -1.0, rtol=1e-6)
    behave = np.log(np.array([[0.1, 0.4]], np.float32))     # w = [10, 2.5], geometric mean 5
    clamp = RejectionConfig(metric="ratio", level="sequence", action="clamp", lower=0.5, upper=2.0)
    loss, stats = losses.decoupled_ppo_loss(zeros, zeros, behave, ones, ones, rejection=clamp)
    np.testing.assert_allclose(loss, -2.0, rtol=1e-6)
    np.testing.assert_allclose(stats["rejection_ratio"], 1.0)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cap", [None, 2.0])
def test_behaviour_cap_and_its_statistics_match_areal(seed, cap):
    """AReaL `ppo_actor_loss_fn` with a token ratio rejection `upper=cap` (what replaced behav_imp_weight_cap):
    dropped tokens stay in the denominator, and behave_approx_kl averages over the kept ones only (prox − behave
    = [0, ln 10] with cap 5 gives 0, not 1.151)."""
    lp, prox, behave, adv, mask = _batch(seed, spread=0.6)
    loss, grad, stats = _ours(lp, prox, behave, adv, mask, eps_clip=0.2, c_clip=3.0, behav_imp_weight_cap=cap)
    rejection = None if cap is None else dict(metric="ratio", level="token", action="mask", lower=None, upper=cap,
                                              agg="mean")
    want_loss, want_grad, want = areal_ppo_actor_loss_fn(lp, prox, behave, adv, mask, eps_clip=0.2, c_clip=3.0,
                                                         rejection=rejection)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(stats["behave_approx_kl"], want["behave_approx_kl"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["behave_cap_ratio"], want["rejection_ratio"], rtol=1e-6)
    zeros = np.zeros((1, 2), np.float32)
    _, s = losses.ppo_actor_loss(zeros, zeros, np.array([[0.0, -np.log(10.0)]], np.float32), np.ones((1, 2)),
                                 np.ones((1, 2)), behav_imp_weight_cap=5.0)
    assert float(s["behave_approx_kl"]) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_m2po_mask_matches_areal(seed):
    """AReaL `_apply_m2po_masking` / `_get_m2po_loss_mask` on random minibatches, including the order of tokens."""
    _, prox, behave, _, mask = _batch(seed, batch=5, time=12, spread=0.3)
    for threshold in (0.01, 0.04, 0.2):
        ours = np.asarray(losses.m2po_mask(prox, behave, mask, m2_threshold=threshold))
        np.testing.assert_array_equal(ours, areal_m2po_loss_mask(behave, prox, mask, threshold))
    assert 0 < (mask & ~np.asarray(losses.m2po_mask(prox, behave, mask, m2_threshold=0.04))).sum() < mask.sum()
    flat = np.full((1, 4), -1.0, np.float32)                # every suffix mean is 1 >= 0.04: all but one go
    assert int(np.asarray(losses.m2po_mask(flat, flat * 0, np.ones((1, 4), bool), m2_threshold=0.04)).sum()) == 1


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eps_clip", [None, 0.2])
def test_m2po_loss_matches_areal(seed, eps_clip):
    """AReaL `grpo_loss_fn` with `m2_threshold`: the M2PO mask replaces the loss mask (the masked tokens leave the
    denominator, unlike the cap), then `ppo_actor_loss_fn` with the behaviour cap. eps_clip=None is M2PO's own
    objective (no trust-region clip); AReaL's example reaches it with eps_clip=0.0, where torch.max's tie at ρ = 1
    halves the first step's gradient — a difference of scale only, which AdamW normalises away."""
    lp, prox, behave, adv, mask = _batch(seed, spread=0.3)
    loss, grad, stats = _ours(lp, prox, behave, adv, mask, eps_clip=eps_clip, behav_imp_weight_cap=5.0,
                              m2_threshold=0.04)
    kept = areal_m2po_loss_mask(behave, prox, mask, 0.04)
    want_loss, want_grad, _ = areal_ppo_actor_loss_fn(
        lp, prox, behave, adv, kept, eps_clip=eps_clip,
        rejection=dict(metric="ratio", level="token", action="mask", lower=None, upper=5.0, agg="mean"))
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(stats["m2po_masked_ratio"], 1 - kept.sum() / mask.sum(), rtol=1e-6)
    registered, _ = losses.get_loss("m2po")(lp, prox, behave, adv, mask, behav_imp_weight_cap=5.0)
    if eps_clip is None:
        np.testing.assert_allclose(registered, loss, rtol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_overlong_penalty_is_once_per_episode_in_areal_order(seed):
    """AReaL `reward_overlong_penalty` then `(r + bias) * scaling`, clipped (PPOActor._compute_advantages), with one
    penalty per episode: the formula on the episode's longest step response, on every row of it."""
    rng = np.random.default_rng(seed)
    episodes = rng.integers(1, 4, size=6)
    episode_ids = np.repeat(np.arange(6) * (2 ** 40) + 7, episodes)
    group_ids = np.repeat(np.arange(6) // 3, episodes)
    rewards = np.repeat(rng.integers(0, 2, size=6).astype(np.float32), episodes)
    lengths = rng.integers(1, 17, size=len(episode_ids))
    mask = np.arange(16)[None, :] < lengths[:, None]
    config = A.AdvantageConfig(overlong_tokens=4, overlong_penalty_factor=0.5, max_response_tokens=16,
                               reward_bias=-0.5, reward_scaling=10.0, reward_clip=4.0)
    shaped = np.asarray(A.compute_token_advantages(rewards, episode_ids, group_ids, mask, config=config).shaped_rewards)
    longest = {e: lengths[episode_ids == e].max() for e in np.unique(episode_ids)}
    penalty = areal_reward_overlong_penalty([longest[e] for e in episode_ids], overlong_tokens=4,
                                            overlong_penalty_factor=0.5, max_response_length=16)
    np.testing.assert_allclose(shaped, np.clip((rewards + penalty - 0.5) * 10.0, -4.0, 4.0), rtol=1e-6)


def test_overlong_penalty_of_a_two_step_episode():
    """The issue's case: rows of 48 and 10 response tokens, budget 48, window 4, reward 1: the episode's reward is
    1 - 1 = 0 on both rows (per row, then averaged, it was 0.5)."""
    mask = np.arange(48)[None, :] < np.array([48, 10])[:, None]
    config = A.AdvantageConfig(estimator="raw", overlong_tokens=4, overlong_penalty_factor=1.0, max_response_tokens=48)
    trace = A.compute_token_advantages(np.ones(2, np.float32), np.array([5, 5]), np.array([1, 1]), mask, config=config)
    np.testing.assert_allclose(trace.episode_rewards, [0.0, 0.0], atol=1e-7)


def test_64_bit_ids_never_merge():
    """Episode and group ids are ranked on the host before jit: 2**40 + 1 and 2**41 + 1 (equal in their low 32 bits)
    stay two groups, as AReaL's group ids would (ids 0 and 1 give the same advantages)."""
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], np.float32)
    mask = np.ones((6, 3), bool)
    wide_groups = np.array([2 ** 40 + 1] * 3 + [2 ** 41 + 1] * 3, np.int64)
    wide_episodes = np.arange(6, dtype=np.int64) * 2 ** 33 + 9    # all equal in their low 32 bits
    narrow = A.compute_token_advantages(rewards, np.arange(6), np.repeat([0, 1], 3), mask).advantages
    wide = A.compute_token_advantages(rewards, wide_episodes, wide_groups, mask).advantages
    np.testing.assert_allclose(wide, narrow, rtol=1e-6)
    assert not np.allclose(np.asarray(narrow), 0)
    np.testing.assert_allclose(A.step_advantages(rewards, wide_episodes, wide_groups),
                               A.step_advantages(rewards, np.arange(6), np.repeat([0, 1], 3)), rtol=1e-6)
    cfg = NormConfig(mean_level="group", std_level="group")
    np.testing.assert_allclose(normalize(rewards, cfg, group_ids=wide_groups),
                               normalize(rewards, cfg, group_ids=np.repeat([0, 1], 3)), rtol=1e-6)


def test_drgrpo_constant_normaliser_is_the_budget_not_the_padding():
    """Dr.GRPO's seq-mean-token-sum-norm divides each sequence's token sum by a constant: the same rows padded to 48
    or 96 tokens give the same loss (they gave losses 2x apart with the padded width), and no constant is assumed."""
    lp, prox, behave, adv, mask = _batch(3, time=40)
    fn = losses.get_loss("drgrpo")
    pad = lambda a, width, v: np.pad(a, [(0, 0), (0, width - a.shape[1])], constant_values=v)  # noqa: E731
    out = [float(fn(*(pad(a, w, v) for a, v in ((lp, 0.0), (prox, 0.0), (behave, 0.0), (adv, 0.0), (mask, False))),
                    agg_normalizer=48.0)[0]) for w in (48, 96)]
    np.testing.assert_allclose(out[0], out[1], rtol=1e-6)
    ratio = np.exp(np.float64(lp) - prox)
    pg = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.2)) * np.exp(np.float64(prox) - behave)
    want = np.mean(np.where(mask, pg, 0.0).sum(-1) / 48.0)
    np.testing.assert_allclose(out[0], want, rtol=1e-5)
    with pytest.raises(ValueError, match="normalizer"):
        fn(lp, prox, behave, adv, mask)


@pytest.mark.parametrize("seed", range(4))
def test_gspo_and_sapo_match_areal(seed):
    """AReaL `ppo_actor_loss_fn(importance_sampling_level="sequence")` (GSPO, token-mean over the minibatch, with
    the behaviour weight) and `sapo_loss_fn` (coupled: behaviour = proximal) on random minibatches."""
    lp, prox, behave, adv, mask = _batch(seed, spread=0.05)
    ours, _ = losses.decoupled_ppo_loss(lp, prox, behave, adv, mask, eps_clip=3e-3, eps_clip_higher=4e-3,
                                        importance_sampling_level="sequence", agg_mode="token-mean")
    np.testing.assert_allclose(ours, areal_gspo_ppo_actor_loss_fn(lp, prox, behave, adv, mask, eps_clip=3e-3,
                                                                  eps_clip_higher=4e-3), rtol=1e-5, atol=1e-6)
    ours, _ = losses.sapo_loss(lp, prox, prox, adv, mask, tau_pos=1.0, tau_neg=1.05)
    np.testing.assert_allclose(ours, areal_sapo_loss_fn(lp, prox, adv, mask, tau_pos=1.0, tau_neg=1.05),
                               rtol=1e-5, atol=1e-6)
