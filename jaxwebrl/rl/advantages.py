"""From episode rewards on browser-step rows to per-token advantages (the paper's steps 1-4, plus adv_norm).

Rows are browser steps. Each row carries its episode's raw reward, `episode_id`, `group_id` (G episodes
of one task instance) and a `loss_mask` [T] over its tokens (1 on policy-generated tokens only).

  1. shape:      r <- clip((r + overlong + reward_bias) * reward_scaling, ±reward_clip), AReaL's order; DAPO's
                 overlong penalty is one per episode (its longest step response), not one per step row
  2. normalise:  one r̂_e per episode by an estimator (GRPO group mean/std, RLOO, Dr.GRPO, ...)
  3. step adv:   r̂_e / T_e (T_e = steps of the episode), or r̂_e / k with `step_adv_const_length = k`
  4. place + GAE: the step advantage is the reward of the row's last policy token; masked GAE
                 (γ, λ, optional critic, KL-in-reward) spreads it over the row's policy tokens
  5. adv_norm:   optional batch/group normalisation of the token advantages (NormConfig)

`compute_token_advantages` runs the whole path; the pieces are public for recipes that need one.
Everything is pure jnp and jittable (configs are frozen dataclasses: pass them as static arguments);
NumPy inputs work eagerly. Group ids of any values and any group sizes are fine; under jit the number of
distinct ids is bounded statically by the row count (see `segments.dense_ids`); concrete ids of any width
(64-bit included) are ranked on the host before jit (`segments.host_dense_ids`), so no two ever merge.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.rl import gae as gae_lib
from jaxwebrl.rl import kl as kl_lib
from jaxwebrl.rl import segments
from jaxwebrl.rl.estimators import get_estimator
from jaxwebrl.rl.normalization import NormConfig, normalize

# ------------------------------------------------------------------------------------ 1. shaping


def shape_rewards(rewards, *, reward_bias: float = 0.0, reward_scaling: float = 1.0,
                  reward_clip: float | None = 20.0):
    """(r + bias) * scaling, clipped to ±reward_clip (None: no clip). [R] -> [R] float32."""
    r = (jnp.asarray(rewards, jnp.float32) + reward_bias) * reward_scaling
    if reward_clip is not None:
        r = jnp.clip(r, -reward_clip, reward_clip)
    return r


def overlong_penalty(response_lengths, *, max_response_tokens: int, overlong_tokens: int,
                     overlong_penalty_factor: float):
    """DAPO soft overlong punishment: 0 up to max - overlong_tokens tokens, then linearly down to
    -factor at max tokens (and beyond). response_lengths [R] -> [R] float32 (<= 0)."""
    check_overlong(overlong_tokens, overlong_penalty_factor, max_response_tokens)
    lengths = jnp.asarray(response_lengths, jnp.float32)
    exceed = lengths - (max_response_tokens - overlong_tokens)
    return jnp.minimum(-exceed / overlong_tokens * overlong_penalty_factor, 0.0)


def check_overlong(overlong_tokens, overlong_penalty_factor, max_response_tokens) -> None:
    """DAPO's overlong window (an int in 1..max_response_tokens) and its penalty factor (> 0), else ValueError."""
    if type(overlong_tokens) is not int or not 0 < overlong_tokens <= max_response_tokens:
        raise ValueError(f"overlong_tokens={overlong_tokens!r}: must be an int in 1..model.max_new_tokens="
                         f"{max_response_tokens} (the window before the budget where the penalty grows)")
    if not overlong_penalty_factor > 0:
        raise ValueError(f"overlong_penalty_factor={overlong_penalty_factor!r}: must be > 0 (DAPO: 1.0)")


def episode_overlong_penalty(response_lengths, episode_ids, **penalty):
    """DAPO's overlong penalty once per episode, on every row of it: `overlong_penalty` of the episode's longest
    step response. A step row's response has the whole generation budget, so a multi-step episode is penalised
    by its worst step, neither diluted by its short steps nor counted once per step.

    response_lengths: [R] policy tokens per step row; episode_ids: [R] ints. Returns [R] float32 (<= 0).
    """
    index, n = segments.dense_ids(jnp.asarray(episode_ids))
    longest = segments.segment_max(jnp.asarray(response_lengths, jnp.int32), index, n)[index]
    return overlong_penalty(longest, **penalty)


# ------------------------------------------------------- 2. episode rows (the estimators: estimators.py)


def _check_rows(rewards, episode_ids, group_ids):
    shapes = [jnp.shape(a) for a in (rewards, episode_ids, group_ids)]
    if len(shapes[0]) != 1 or shapes[1] != shapes[0] or shapes[2] != shapes[0]:
        raise ValueError("rewards, episode_ids and group_ids must all be [R] (one entry per step row); "
                         f"got {shapes}")


def _episode_table(rewards, episode_ids, group_ids, row_valid=None):
    """Collapse step rows to episodes. Returns dict of [R]-sized episode arrays (R = rows = static
    bound on episodes) and the row -> episode index. row_valid [R] bool (None: all): rows that are steps of an
    episode; the others (a padded batch's padding rows) count in no episode, so an episode of padding alone is
    not valid."""
    rewards = jnp.asarray(rewards, jnp.float32)
    episode_ids = jnp.asarray(episode_ids)
    group_ids = jnp.asarray(group_ids)
    _check_rows(rewards, episode_ids, group_ids)
    real = jnp.ones(rewards.shape, bool) if row_valid is None else jnp.asarray(row_valid).astype(bool)
    ep_index, n_ep = segments.dense_ids(episode_ids)
    g_index, _ = segments.dense_ids(group_ids)
    steps = segments.segment_sum(real.astype(jnp.float32), ep_index, n_ep)
    ep_reward = segments.segment_sum(jnp.where(real, rewards, 0.0), ep_index, n_ep) / jnp.maximum(steps, 1.0)
    ep_group = segments.segment_max(jnp.where(real, g_index, 0), ep_index, n_ep)
    valid = steps > 0
    ep_group = jnp.where(valid, ep_group, 0)
    return dict(reward=ep_reward, group=ep_group, steps=steps, valid=valid), ep_index


def _check_episode_rows(rewards, episode_ids, group_ids):
    """Eager-only (NumPy, O(R log R)): every row of an episode carries the same reward and group id."""
    r, e, g = (np.asarray(a) for a in (rewards, episode_ids, group_ids))
    if r.size == 0:
        return
    order = np.argsort(e, kind="stable")
    e_sorted = e[order]
    starts = np.flatnonzero(np.r_[True, e_sorted[1:] != e_sorted[:-1]])
    for name, values in (("rewards", r.astype(np.float64)), ("group ids", g)):
        v = values[order]
        bad = np.maximum.reduceat(v, starts) != np.minimum.reduceat(v, starts)
        if bad.any():
            ep = e_sorted[starts[np.argmax(bad)]]
            fix = ("pass the episode reward on every step row" if name == "rewards"
                   else "all rows of an episode must share its group_id")
            raise ValueError(f"episode {ep} has different {name} on its rows {values[e == ep]}; {fix}")


# --------------------------------------------------------------------------- 3. step advantages


def check_const_length(const_length) -> None:
    """`step_adv_const_length` (k of the step normaliser 1/k): None (1/|τ|) or a number > 0, else ValueError."""
    if const_length is not None and not const_length > 0:
        raise ValueError(f"step_adv_const_length={const_length!r}: k must be > 0 (the paper uses 10) or None for 1/|τ|")


def _step_values(r_hat, table, ep_index, const_length):
    """Step 3 (checked by the callers: `check_const_length`)."""
    if const_length is None:
        denom = table["steps"]
    else:
        denom = jnp.full_like(table["steps"], float(const_length))
    per_episode = jnp.where(table["valid"], r_hat / jnp.maximum(denom, 1e-30), 0.0)
    return per_episode[ep_index]


def step_advantages(rewards, episode_ids, group_ids, *, const_length=None, std_unbiased=False, eps=1e-5):
    """The paper's steps 1-2 on step rows: group-normalise one reward per episode, then divide.

    Args:
      rewards: [R] float episode reward on every step row of the episode (all rows equal).
      episode_ids: [R] int episode id per row.
      group_ids: [R] int group id per row (groups may have any size).
      const_length: None -> r̂_e / T_e (T_e = rows of episode e); k > 0 -> r̂_e / k (constT10: k = 10).
      std_unbiased: population std (False, the paper's) or sample std.
      eps: added to the group std.

    Returns:
      [R] float32 step advantage per row. Zero-variance groups give exactly 0.
    """
    rewards, episode_ids, group_ids = segments.as_arrays(rewards, episode_ids, group_ids)
    _check_rows(rewards, episode_ids, group_ids)
    if segments.is_concrete(rewards, episode_ids, group_ids):
        _check_episode_rows(rewards, episode_ids, group_ids)
    check_const_length(const_length)
    episode_ids, group_ids = segments.host_dense_ids(episode_ids), segments.host_dense_ids(group_ids)
    return _step_advantages(rewards, episode_ids, group_ids, const_length=const_length,
                            std_unbiased=std_unbiased, eps=eps)


@functools.partial(jax.jit, static_argnames=("const_length", "std_unbiased", "eps"))
def _step_advantages(rewards, episode_ids, group_ids, *, const_length, std_unbiased, eps):
    table, ep_index = _episode_table(rewards, episode_ids, group_ids)
    r_hat = get_estimator("grpo")(table["reward"], table["group"], table["valid"],
                                  std_unbiased=std_unbiased, eps=eps)
    return _step_values(r_hat, table, ep_index, const_length)


# -------------------------------------------------------------------- 4. placement and KL reward


def last_token_index(loss_mask):
    """[B] int32 index of the last policy token of each row, -1 when the row has none."""
    mask = jnp.asarray(loss_mask).astype(bool)
    time = mask.shape[-1]
    idx = jnp.where(mask, jnp.arange(time, dtype=jnp.int32), -1)
    return idx.max(axis=-1)


def place_on_last_token(step_values, loss_mask):
    """Token reward [B, T] float32 holding `step_values` [B] on each row's last policy token, 0 elsewhere.
    A row without policy tokens gets nothing (it has no token to carry the reward)."""
    mask = jnp.asarray(loss_mask).astype(bool)
    if mask.ndim != 2:
        raise ValueError(f"loss_mask must be [B, T], got shape {mask.shape}")
    step_values = jnp.asarray(step_values, jnp.float32)
    if step_values.shape != mask.shape[:1]:
        raise ValueError(f"step values shape {step_values.shape} must be [B] = {mask.shape[:1]}")
    last = last_token_index(mask)
    hit = jnp.arange(mask.shape[1], dtype=jnp.int32)[None, :] == last[:, None]
    return jnp.where(hit & mask, step_values[:, None], 0.0)


def kl_penalty_rewards(logprobs, ref_logprobs, loss_mask, *, kl_ctl: float, estimator: str = "k1"):
    """Per-token KL-in-reward term -kl_ctl * KL_est(logprobs || ref) on policy tokens. [B, T] float32."""
    kl = kl_lib.kl_estimate(logprobs, ref_logprobs, estimator)
    return jnp.where(jnp.asarray(loss_mask).astype(bool), -kl_ctl * kl, 0.0)


def adv_norm(advantages, loss_mask, config: NormConfig | None, group_ids=None):
    """Step 5: normalise token advantages [B, T] over policy tokens, batch- or group-wise by row."""
    return normalize(advantages, config, mask=loss_mask, group_ids=group_ids)


# ----------------------------------------------------------------------------- the whole path


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Every knob of the advantage path (hashable: pass as a static jit argument)."""

    estimator: str = "grpo"
    std_unbiased: bool = False
    eps: float = 1e-5
    reward_bias: float = 0.0
    reward_scaling: float = 1.0
    reward_clip: float | None = 20.0
    overlong_tokens: int | None = None
    overlong_penalty_factor: float | None = None
    max_response_tokens: int | None = None
    step_adv_const_length: float | None = None
    discount: float = 1.0
    gae_lambda: float | str = 1.0
    gae_lambda_kwargs: tuple = ()
    gae_timestep_unit: str = "token"
    max_turns: int | None = None
    kl_ctl: float = 0.0
    kl_estimator: str = "k1"
    adv_norm: NormConfig | None = None

    def __post_init__(self):
        get_estimator(self.estimator)
        if self.gae_timestep_unit not in ("token", "turn"):
            raise ValueError(f"gae_timestep_unit must be 'token' or 'turn', got {self.gae_timestep_unit!r}")
        if self.gae_timestep_unit == "turn" and not self.max_turns:
            raise ValueError("gae_timestep_unit='turn' needs max_turns (static bound on turns per row)")
        if self.overlong_tokens is not None and (self.max_response_tokens is None
                                                 or self.overlong_penalty_factor is None):
            raise ValueError("overlong_tokens needs max_response_tokens and overlong_penalty_factor too")
        if self.overlong_tokens is not None:
            check_overlong(self.overlong_tokens, self.overlong_penalty_factor, self.max_response_tokens)
        kl_fix = kl_lib.estimator_problem(self.kl_estimator)
        if kl_fix is not None:
            raise ValueError(f"kl_estimator={self.kl_estimator!r}: {kl_fix}")
        check_const_length(self.step_adv_const_length)
        if not isinstance(self.gae_lambda_kwargs, tuple):
            raise ValueError("gae_lambda_kwargs must be a tuple of (name, value) pairs (hashable)")


class AdvantageTrace(NamedTuple):
    """Every intermediate of the path (for the trainer's logs and the loss-analysis notebook)."""

    shaped_rewards: jnp.ndarray    # [R] step 1, per row
    episode_rewards: jnp.ndarray   # [R] step 2, r̂_e broadcast to the episode's rows
    step_advantages: jnp.ndarray   # [R] step 3, r̂_e / (k or T_e)
    token_rewards: jnp.ndarray     # [B, T] step 4a, placed step advantage (+ KL reward)
    advantages: jnp.ndarray        # [B, T] step 4b/5, after GAE and adv_norm; 0 off the mask
    returns: jnp.ndarray           # [B, T] GAE returns (critic targets)


def compute_token_advantages(rewards, episode_ids, group_ids, loss_mask, *,
                             config: AdvantageConfig = AdvantageConfig(), values=None, logprobs=None,
                             ref_logprobs=None, bootstrap_values=None, terminated=None,
                             turn_ids=None, row_valid=None) -> AdvantageTrace:
    """Paper path 1-4 (+ adv_norm) on step rows; what the trainer calls.

    Args:
      rewards: [R] raw episode reward on each step row.
      episode_ids, group_ids: [R] ints.
      loss_mask: [R, T] 1 on policy tokens of each row.
      config: AdvantageConfig (static under jit: `jax.jit(f, static_argnames="config")`).
      values: [R, T] critic values (PPO with a critic), or None.
      logprobs, ref_logprobs: [R, T] for KL-in-reward when config.kl_ctl > 0.
      bootstrap_values / terminated: [R] per-row truncation semantics for GAE (default: terminal).
      turn_ids: [R, T] ints (-1 off-turn) when config.gae_timestep_unit == "turn".
      row_valid: [R] bool, or None (every row real): the rows that are steps. The trainer passes its whole padded
        batch (a static [B, T] whatever the real-row count, so this jitted path compiles once per batch shape);
        padding rows (loss_mask 0) then belong to no episode and change no estimate, batch-level ones included.

    Returns:
      AdvantageTrace; `.advantages` [R, T] float32 is the loss input.
    """
    rewards, episode_ids, group_ids, loss_mask = segments.as_arrays(rewards, episode_ids, group_ids, loss_mask)
    _check_rows(rewards, episode_ids, group_ids)
    shape = jnp.shape(loss_mask)
    if len(shape) != 2 or shape[0] != jnp.shape(rewards)[0]:
        raise ValueError(f"loss_mask must be [R, T] with R = len(rewards) = {jnp.shape(rewards)[0]}, "
                         f"got {shape}")
    if row_valid is not None and jnp.shape(row_valid) != shape[:1]:
        raise ValueError(f"row_valid shape {jnp.shape(row_valid)} must be [R] = {shape[:1]}")
    for name, arr in dict(values=values, logprobs=logprobs, ref_logprobs=ref_logprobs, turn_ids=turn_ids).items():
        if arr is not None and jnp.shape(arr) != shape:
            raise ValueError(f"{name} shape {jnp.shape(arr)} must equal loss_mask shape {shape}")
    if config.kl_ctl and (logprobs is None or ref_logprobs is None):
        raise ValueError("kl_ctl > 0 needs logprobs and ref_logprobs [R, T]")
    if config.gae_timestep_unit == "turn":
        if turn_ids is None:
            raise ValueError("gae_timestep_unit='turn' needs turn_ids [R, T]")
        if segments.is_concrete(turn_ids) and int(np.max(np.asarray(turn_ids), initial=-1)) >= config.max_turns:
            raise ValueError(f"turn id {int(np.max(np.asarray(turn_ids)))} >= max_turns={config.max_turns}")
    episode_ids, group_ids = segments.host_dense_ids(episode_ids), segments.host_dense_ids(group_ids)
    return _token_advantages(rewards, episode_ids, group_ids, loss_mask, config, values, logprobs,
                             ref_logprobs, bootstrap_values, terminated, turn_ids, row_valid)


@functools.partial(jax.jit, static_argnames=("config",))
def _token_advantages(rewards, episode_ids, group_ids, loss_mask, config, values, logprobs, ref_logprobs,
                      bootstrap_values, terminated, turn_ids, row_valid):
    mask = jnp.asarray(loss_mask).astype(bool)
    raw = jnp.asarray(rewards, jnp.float32)
    if config.overlong_tokens is not None:
        raw = raw + episode_overlong_penalty(mask.sum(-1), episode_ids, max_response_tokens=config.max_response_tokens,
                                             overlong_tokens=config.overlong_tokens,
                                             overlong_penalty_factor=config.overlong_penalty_factor)
    shaped = shape_rewards(raw, reward_bias=config.reward_bias, reward_scaling=config.reward_scaling,
                           reward_clip=config.reward_clip)
    table, ep_index = _episode_table(shaped, episode_ids, group_ids, row_valid)
    estimator = get_estimator(config.estimator)
    r_hat = estimator(table["reward"], table["group"], table["valid"],
                      std_unbiased=config.std_unbiased, eps=config.eps)
    step_adv = _step_values(r_hat, table, ep_index, config.step_adv_const_length)
    token_rewards = place_on_last_token(step_adv, mask)
    kl_reward = None
    if config.kl_ctl:
        kl_reward = kl_penalty_rewards(logprobs, ref_logprobs, mask, kl_ctl=config.kl_ctl,
                                       estimator=config.kl_estimator)
    if config.gae_timestep_unit == "token":
        if kl_reward is not None:
            token_rewards = token_rewards + kl_reward
        lam = gae_lib.resolve_lambda(config.gae_lambda, mask.sum(-1), config.gae_lambda_kwargs)
        adv, returns = gae_lib.masked_gae(token_rewards, mask, values, gamma=config.discount, lam=lam,
                                          bootstrap_values=bootstrap_values, terminated=terminated)
    else:
        turn_ids = jnp.where(mask, jnp.asarray(turn_ids), -1)
        n_turns = jnp.maximum(turn_ids.max(axis=-1) + 1, 0)  # turns are numbered 0.. in time order
        lam = gae_lib.resolve_lambda(config.gae_lambda, n_turns, config.gae_lambda_kwargs)
        adv, returns = gae_lib.turn_gae(token_rewards, turn_ids, values, max_turns=config.max_turns,
                                        gamma=config.discount, lam=lam,
                                        bootstrap_values=bootstrap_values, terminated=terminated)
        if kl_reward is not None:  # token-local: not part of the turn recursion or the critic target
            adv = adv + kl_reward
    adv = adv_norm(adv, mask, config.adv_norm, group_ids=group_ids)
    return AdvantageTrace(shaped_rewards=shaped, episode_rewards=r_hat[ep_index], step_advantages=step_adv,
                          token_rewards=token_rewards, advantages=adv, returns=returns)


def jitted_token_advantages(config: AdvantageConfig):
    """`compute_token_advantages` bound to one config; the body is jitted (config static), so the
    result can be called eagerly on NumPy arrays or inside another jit."""
    return functools.partial(compute_token_advantages, config=config)
