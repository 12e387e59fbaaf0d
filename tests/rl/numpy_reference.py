"""A small, independent NumPy (float64) reference of the RL core, written loop-first for readability.

Used by the property tests (hypothesis) and by bench/rl_core.py. It shares no code with jaxwebrl.rl.
"""

from __future__ import annotations

import numpy as np


def normalize(x, mask=None, group_ids=None, *, mean_level="batch", std_level="batch", leave1out=False,
              unbiased=True, eps=1e-5):
    """NormConfig semantics, one set at a time. x [N] or [N, T]; group_ids [N]."""
    x = np.asarray(x, np.float64)
    mask = np.ones(x.shape, bool) if mask is None else np.asarray(mask, bool)
    rows = np.arange(x.shape[0])

    def sets(level):
        if level == "batch":
            return [rows]
        gids = np.asarray(group_ids)
        return [rows[gids == g] for g in np.unique(gids)]

    centred = np.zeros_like(x)
    if mean_level is None:
        centred = np.where(mask, x, 0.0)
    else:
        for members in sets(mean_level):
            vals = x[members][mask[members]]
            n = vals.size
            sub = x[members]
            if n == 0:
                continue
            if leave1out:
                base = np.where(n > 1, (vals.sum() - sub) / max(n - 1, 1), 0.0)
            else:
                base = np.full(sub.shape, vals.mean())
            c = sub - base
            if (n >= 2 or not leave1out) and np.all(vals == vals[0]):
                c = np.zeros_like(c)
            centred[members] = np.where(mask[members], c, 0.0)
    if std_level is None:
        return centred
    out = np.zeros_like(x)
    for members in sets(std_level):
        vals = centred[members][mask[members]]
        n = vals.size
        if unbiased:
            std = np.sqrt((vals ** 2).sum() / (n - 1)) if n > 1 else 1.0
        else:
            std = np.sqrt((vals ** 2).sum() / n) if n > 0 else 1.0
        out[members] = np.where(mask[members], centred[members] / (std + eps), 0.0)
    return out


def step_advantages(rewards, episode_ids, group_ids, *, const_length=None, unbiased=False, eps=1e-5,
                    mean_level="group", std_level="group", leave1out=False):
    """Steps 1-2: one normalised reward per episode, divided by T_e or k, broadcast to the rows."""
    rewards, episode_ids, group_ids = (np.asarray(a) for a in (rewards, episode_ids, group_ids))
    episodes = np.unique(episode_ids)
    ep_reward = np.array([rewards[episode_ids == e].mean() for e in episodes], np.float64)
    ep_group = np.array([group_ids[episode_ids == e][0] for e in episodes])
    ep_steps = np.array([(episode_ids == e).sum() for e in episodes], np.float64)
    r_hat = normalize(ep_reward, None, ep_group, mean_level=mean_level, std_level=std_level,
                      leave1out=leave1out, unbiased=unbiased, eps=eps)
    denom = ep_steps if const_length is None else np.full_like(ep_steps, const_length)
    per_ep = dict(zip(episodes.tolist(), (r_hat / denom).tolist()))
    return np.array([per_ep[e] for e in episode_ids.tolist()], np.float64)


def place_on_last_token(step_values, loss_mask):
    loss_mask = np.asarray(loss_mask, bool)
    out = np.zeros(loss_mask.shape, np.float64)
    for b in range(loss_mask.shape[0]):
        idx = np.nonzero(loss_mask[b])[0]
        if idx.size:
            out[b, idx[-1]] = step_values[b]
    return out


def masked_gae(rewards, loss_mask, values=None, *, gamma=1.0, lam=1.0, bootstrap_values=None,
               terminated=None):
    """Backward loop over time, vectorised over rows; absent time carries next value/advantage."""
    rewards = np.asarray(rewards, np.float64)
    mask = np.asarray(loss_mask, bool)
    batch, time = rewards.shape
    values = np.zeros_like(rewards) if values is None else np.asarray(values, np.float64)
    lam = np.broadcast_to(np.asarray(lam, np.float64), (batch,))
    gamma = np.broadcast_to(np.asarray(gamma, np.float64), (batch,))
    if terminated is None:
        terminated = np.ones(batch, bool) if bootstrap_values is None else np.zeros(batch, bool)
    boot = np.zeros(batch) if bootstrap_values is None else np.asarray(bootstrap_values, np.float64)
    next_value = np.where(terminated, 0.0, boot)
    next_adv = np.zeros(batch)
    adv = np.zeros_like(rewards)
    for t in range(time - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = np.where(m, a, 0.0)
        next_adv = np.where(m, a, next_adv)
        next_value = np.where(m, values[:, t], next_value)
    returns = np.where(mask, adv + values, 0.0)
    return adv, returns


def grpo_token_advantages(rewards, episode_ids, group_ids, loss_mask, *, const_length=None, eps=1e-5):
    """The paper's default path 1-4 (γ = λ = 1, no critic, no adv_norm)."""
    step = step_advantages(rewards, episode_ids, group_ids, const_length=const_length, eps=eps)
    token_rewards = place_on_last_token(step, loss_mask)
    adv, _ = masked_gae(token_rewards, loss_mask)
    return adv


def ppo_actor_loss_and_grad(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *,
                            eps_clip=0.2, eps_clip_higher=None, c_clip=None, behav_imp_weight_cap=None):
    """Decoupled PPO loss (token mean over the minibatch) and its analytic gradient d loss / d logprobs."""
    lp, prox, beh, adv = (np.asarray(a, np.float64) for a in (logprobs, prox_logprobs, behave_logprobs,
                                                              advantages))
    mask = np.asarray(loss_mask, bool)
    hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    ratio = np.exp(np.where(mask, lp - prox, 0.0))
    clipped = np.clip(ratio, 1 - eps_clip, 1 + hi)
    pg1, pg2 = -adv * ratio, -adv * clipped
    pg = np.maximum(pg1, pg2)
    unclipped_active = pg1 >= pg2          # the max picked the ratio branch (gradient flows)
    dual_bind = np.zeros(mask.shape, bool)
    if c_clip is not None:
        cap = c_clip * np.abs(adv)
        dual_bind = cap < pg
        pg = np.minimum(pg, cap)
    w = np.exp(np.where(mask, prox - beh, 0.0))
    kept = mask.copy()
    if behav_imp_weight_cap is not None:
        kept &= w <= behav_imp_weight_cap
    n = max(mask.sum(), 1)
    loss = np.where(kept, w * pg, 0.0).sum() / n
    grad = np.where(kept & unclipped_active & ~dual_bind, w * (-adv * ratio), 0.0) / n
    return loss, grad
