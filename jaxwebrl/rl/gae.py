"""Masked generalised advantage estimation (GAE), turn-unit GAE, SAO skip-observation GAE, λ functions.

Time semantics, shared by every estimator here:
  * valid positions (`loss_mask`/`valid` = 1) are time steps; everything else (prompt, observation,
    padding) is *absent time*: it is skipped, the recursion carries the next value and next advantage
    straight across it, and it is never a terminal.
  * after the last valid step of a row the episode either terminated (future value 0) or was truncated
    (future value = `bootstrap_values[row]`), chosen per row by `terminated`.
  * δ_t = r_t + γ (1 - d_t) V_next - V_t,  A_t = δ_t + γ λ (1 - d_t) A_next,  returns = A + V.

The backward recursion is a first-order linear recurrence, solved with `lax.associative_scan`
(log-depth, no Python or `lax.scan` loop over time), so it stays fast at [256, 4096].
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.rl import segments


def _per_row(x, batch: int, name: str):
    """Scalar or [B] -> [B, 1] float32."""
    x = jnp.asarray(x, jnp.float32)
    if x.ndim == 0:
        return jnp.broadcast_to(x, (batch, 1))
    if x.shape != (batch,):
        raise ValueError(f"{name} must be a scalar or [B] = [{batch}], got shape {x.shape}")
    return x[:, None]


def reverse_linear_recurrence(coef, delta):
    """Solve A_t = delta_t + coef_t * A_{t+1} along the last axis with A_T = 0. [B, T] float32."""
    coef_rev = jnp.flip(coef, axis=-1)
    delta_rev = jnp.flip(delta, axis=-1)

    def combine(earlier, later):
        a1, b1 = earlier
        a2, b2 = later
        return a1 * a2, a2 * b1 + b2

    _, out = jax.lax.associative_scan(combine, (coef_rev, delta_rev), axis=-1)
    return jnp.flip(out, axis=-1)


def _next_valid(values_at, valid, end_values):
    """For each t: `values_at` at the first valid s > t in the row, else `end_values` [B]. [B, T]."""
    batch, time = valid.shape
    pos = jnp.where(valid, jnp.arange(time, dtype=jnp.int32)[None, :], time)
    first_at_or_after = jax.lax.cummin(pos, axis=1, reverse=True)
    nxt = jnp.concatenate([first_at_or_after[:, 1:], jnp.full((batch, 1), time, jnp.int32)], axis=1)
    padded = jnp.concatenate([values_at, end_values[:, None]], axis=1)
    return jnp.take_along_axis(padded, nxt, axis=1)


def _gae_core(rewards, valid, current_values, next_candidate_values, dones, *, gamma, lam,
              bootstrap_values, terminated):
    """Shared recursion. All [B, T]; gamma/lam scalar or [B]; bootstrap/terminated [B] or None."""
    batch, _ = rewards.shape
    gamma = _per_row(gamma, batch, "gamma")
    lam = _per_row(lam, batch, "lam")
    if bootstrap_values is None:
        end = jnp.zeros((batch,), jnp.float32)
    else:
        end = jnp.broadcast_to(jnp.asarray(bootstrap_values, jnp.float32), (batch,))
    if terminated is None:
        terminated = jnp.ones((batch,), bool) if bootstrap_values is None else jnp.zeros((batch,), bool)
    terminated = jnp.broadcast_to(jnp.asarray(terminated).astype(bool), (batch,))
    end = jnp.where(terminated, 0.0, end)
    not_done = 1.0 - dones
    if next_candidate_values is None:  # no critic (V = 0): only the last valid step sees the end value
        time = valid.shape[1]
        last = jnp.where(valid, jnp.arange(time, dtype=jnp.int32)[None, :], -1).max(axis=1)
        is_last = jnp.arange(time, dtype=jnp.int32)[None, :] == last[:, None]
        next_value = jnp.where(is_last, end[:, None], 0.0)
    else:
        next_value = _next_valid(next_candidate_values, valid, end)
    delta = rewards + gamma * not_done * next_value - current_values
    delta = jnp.where(valid, delta, 0.0)
    coef = jnp.where(valid, gamma * lam * not_done, 1.0)
    adv = reverse_linear_recurrence(coef, delta)
    adv = jnp.where(valid, adv, 0.0)
    returns = jnp.where(valid, adv + current_values, 0.0)
    return adv, returns


def _check_shapes(rewards, **others):
    """Static shape checks before entering jit: every given array must be [B, T] like rewards."""
    shape = jnp.shape(rewards)
    if len(shape) != 2:
        raise ValueError(f"rewards must be [B, T], got shape {shape}")
    for name, arr in others.items():
        if arr is not None and jnp.shape(arr) != shape:
            raise ValueError(f"{name} shape {jnp.shape(arr)} != rewards shape {shape}")


def _prep(rewards, valid, values):
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [B, T], got shape {rewards.shape}")
    valid = jnp.asarray(valid).astype(bool)
    if valid.shape != rewards.shape:
        raise ValueError(f"mask shape {valid.shape} != rewards shape {rewards.shape}")
    values = jnp.zeros(rewards.shape, jnp.float32) if values is None else jnp.asarray(values, jnp.float32)
    if values.shape != rewards.shape:
        raise ValueError(f"values shape {values.shape} != rewards shape {rewards.shape}")
    rewards = jnp.where(valid, rewards, 0.0)
    values = jnp.where(valid, values, 0.0)
    return rewards, valid, values


def masked_gae(rewards, loss_mask, values=None, *, gamma=1.0, lam=1.0, bootstrap_values=None,
               terminated=None):
    """Token-level GAE over the `loss_mask`ed tokens of each row.

    Args:
      rewards: [B, T] float32 per-token rewards (only masked-in positions are read).
      loss_mask: [B, T] 1 on policy tokens (time steps); 0 is absent time.
      values: [B, T] critic values V(s_t), or None for no critic (V = 0).
      gamma, lam: scalars or [B] per row (λ functions give per-row λ).
      bootstrap_values: [B] value after the last valid step for truncated rows, or None (0).
      terminated: [B] bool; default True for every row when bootstrap_values is None, else False.

    Returns:
      (advantages [B, T] float32, returns [B, T] float32), 0 outside the mask.
    """
    _check_shapes(rewards, loss_mask=loss_mask, values=values)
    return _masked_gae(rewards, loss_mask, values, gamma, lam, bootstrap_values, terminated)


@jax.jit
def _masked_gae(rewards, loss_mask, values, gamma, lam, bootstrap_values, terminated):
    no_critic = values is None
    rewards, valid, values = _prep(rewards, loss_mask, values)
    return _gae_core(rewards, valid, values, None if no_critic else values, jnp.zeros_like(rewards),
                     gamma=gamma, lam=lam,
                     bootstrap_values=bootstrap_values, terminated=terminated)


def discounted_returns(rewards, valid, *, gamma=1.0, bootstrap_values=None, terminated=None):
    """G_t = r_t + γ G_next over valid steps (GAE with V = 0, λ = 1). [B, T] float32."""
    _, returns = masked_gae(rewards, valid, None, gamma=gamma, lam=1.0,
                            bootstrap_values=bootstrap_values, terminated=terminated)
    return returns


def skip_observation_gae(rewards, first_values, last_values, valid, *, dones=None, gamma=1.0, lam=1.0,
                         bootstrap_values=None, terminated=None):
    """SAO skip-observation GAE, one entry per semantic action (observations never become steps).

    δ_i = r_i + γ (1 - d_i) V(a_{i+1,0}) - V(a_{i,N}),   A_i = δ_i + γ λ (1 - d_i) A_{i+1}

    Args:
      rewards: [B, N] reward after action i.
      first_values: [B, N] critic value at the first token of action i, V(a_{i,0}).
      last_values: [B, N] critic value at the last token of action i, V(a_{i,N}).
      valid: [B, N] 1 for real actions, 0 for padding (absent time, not a terminal).
      dones: [B, N] true terminal after action i (no bootstrap past it), default none.
      bootstrap_values / terminated: as in `masked_gae`, for the step after the last valid action.

    Returns:
      (advantages [B, N], returns [B, N]) with returns = A + V(a_{i,N}).
    """
    _check_shapes(rewards, first_values=first_values, last_values=last_values, valid=valid, dones=dones)
    return _skip_observation_gae(rewards, first_values, last_values, valid, dones, gamma, lam,
                                 bootstrap_values, terminated)


@jax.jit
def _skip_observation_gae(rewards, first_values, last_values, valid, dones, gamma, lam, bootstrap_values,
                          terminated):
    rewards, valid, last_values = _prep(rewards, valid, last_values)
    first_values = jnp.where(valid, jnp.asarray(first_values, jnp.float32), 0.0)
    d = jnp.zeros_like(rewards) if dones is None else jnp.asarray(dones).astype(jnp.float32)
    return _gae_core(rewards, valid, last_values, first_values, jnp.where(valid, d, 0.0), gamma=gamma,
                     lam=lam, bootstrap_values=bootstrap_values, terminated=terminated)


def turn_gae(token_rewards, turn_ids, values=None, *, max_turns: int, gamma=1.0, lam=1.0,
             bootstrap_values=None, terminated=None):
    """Turn-unit GAE: every turn is one time step; its advantage is broadcast to all its tokens.

    A turn's reward is the sum of its tokens' rewards; its value is the critic at its first token
    (the state it acts from). Turns are numbered 0..max_turns-1 in time order within each row.

    Args:
      token_rewards: [B, T] float32.
      turn_ids: [B, T] int, the turn index of each policy token, -1 on prompt/observation/padding.
      values: [B, T] critic values or None.
      max_turns: static bound on turns per row (ids >= max_turns are an error when checkable).

    Returns:
      (advantages [B, T], returns [B, T]) broadcast per turn, 0 where turn_ids < 0.
    """
    _check_shapes(token_rewards, turn_ids=turn_ids, values=values)
    if segments.is_concrete(turn_ids) and int(np.max(np.asarray(turn_ids), initial=-1)) >= max_turns:
        raise ValueError(f"turn id {int(np.max(np.asarray(turn_ids)))} >= max_turns={max_turns}; "
                         "raise max_turns")
    return _turn_gae(token_rewards, turn_ids, values, max_turns, gamma, lam, bootstrap_values, terminated)


@functools.partial(jax.jit, static_argnames=("max_turns",))
def _turn_gae(token_rewards, turn_ids, values, max_turns, gamma, lam, bootstrap_values, terminated):
    token_rewards = jnp.asarray(token_rewards, jnp.float32)
    turn_ids = jnp.asarray(turn_ids).astype(jnp.int32)
    batch, time = token_rewards.shape
    in_turn = turn_ids >= 0
    dummy = batch * max_turns
    flat = jnp.where(in_turn, jnp.arange(batch, dtype=jnp.int32)[:, None] * max_turns + turn_ids, dummy)
    flat = flat.reshape(-1)
    nseg = dummy + 1
    turn_reward = segments.segment_sum(jnp.where(in_turn, token_rewards, 0.0).reshape(-1), flat, nseg)
    count = segments.segment_sum(in_turn.reshape(-1).astype(jnp.int32), flat, nseg)
    pos = jnp.broadcast_to(jnp.arange(time, dtype=jnp.int32), (batch, time)).reshape(-1)
    first_pos = segments.segment_min(jnp.where(in_turn.reshape(-1), pos, time), flat, nseg)
    if values is None:
        turn_value = jnp.zeros((nseg,), jnp.float32)
    else:
        values = jnp.asarray(values, jnp.float32)
        row = jnp.arange(nseg, dtype=jnp.int32) // max_turns
        turn_value = values[jnp.minimum(row, batch - 1), jnp.minimum(first_pos, time - 1)]
    grid = lambda v: v[:dummy].reshape(batch, max_turns)  # noqa: E731
    turn_valid = grid(count) > 0
    adv, ret = _gae_core(jnp.where(turn_valid, grid(turn_reward), 0.0), turn_valid,
                         jnp.where(turn_valid, grid(turn_value), 0.0),
                         jnp.where(turn_valid, grid(turn_value), 0.0),
                         jnp.zeros((batch, max_turns), jnp.float32), gamma=gamma, lam=lam,
                         bootstrap_values=bootstrap_values, terminated=terminated)
    adv_tok = jnp.concatenate([adv.reshape(-1), jnp.zeros((1,), jnp.float32)])[flat].reshape(batch, time)
    ret_tok = jnp.concatenate([ret.reshape(-1), jnp.zeros((1,), jnp.float32)])[flat].reshape(batch, time)
    return adv_tok, ret_tok


# ---------------------------------------------------------------- λ functions (per-row λ from length)

def vapo_length_adaptive_lambda(lengths, *, alpha: float):
    """VAPO: λ = max(0, 1 - 1 / (α L)) for L > 0, 0 for empty rows. lengths [B] -> [B] float32."""
    if isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"vapo_length_adaptive needs alpha > 0, got {alpha!r}")
    lengths = jnp.asarray(lengths, jnp.float32)
    lam = jnp.maximum(1.0 - 1.0 / (alpha * jnp.maximum(lengths, 1.0)), 0.0)
    return jnp.where(lengths > 0, lam, 0.0)


def relative_position_lambda(lengths, *, q: float):
    """λ = q^(1/(L-1)) for L >= 2 (a terminal reward keeps fraction q at the first step), 1 for L = 1,
    0 for L = 0. lengths [B] -> [B] float32."""
    if isinstance(q, bool) or not 0 < q <= 1:
        raise ValueError(f"relative_position needs 0 < q <= 1, got {q!r}")
    lengths = jnp.asarray(lengths, jnp.float32)
    lam = jnp.power(jnp.float32(q), 1.0 / jnp.maximum(lengths - 1.0, 1.0))
    return jnp.where(lengths >= 2, lam, jnp.where(lengths == 1, 1.0, 0.0))


LAMBDA_FNS = {
    "vapo_length_adaptive": vapo_length_adaptive_lambda,
    "relative_position": relative_position_lambda,
}


def resolve_lambda(gae_lambda, lengths, kwargs=()):
    """A float λ stays a float; a name from LAMBDA_FNS gives [B] λ from per-row `lengths` [B]."""
    if isinstance(gae_lambda, str):
        if gae_lambda not in LAMBDA_FNS:
            raise ValueError(f"unknown gae_lambda function {gae_lambda!r}; choose one of {sorted(LAMBDA_FNS)}")
        return LAMBDA_FNS[gae_lambda](lengths, **dict(kwargs))
    return gae_lambda


def turn_starts(loss_mask):
    """[B, T] bool: the first token of each contiguous run of policy tokens (a turn), where `turn_gae` reads the
    critic's value."""
    mask = jnp.asarray(loss_mask).astype(bool)
    return mask & ~jnp.concatenate([jnp.zeros_like(mask[:, :1]), mask[:, :-1]], axis=1)


def turn_ids_from_mask(loss_mask):
    """Turn ids for `turn_gae` from a policy-token mask: each contiguous run of 1s is one turn, numbered 0, 1, ...
    in time order within its row; -1 off the mask. [B, T] -> [B, T] int32 (a step row's one response: turn 0)."""
    mask = jnp.asarray(loss_mask).astype(bool)
    return jnp.where(mask, jnp.cumsum(turn_starts(mask), axis=1, dtype=jnp.int32) - 1, -1)
