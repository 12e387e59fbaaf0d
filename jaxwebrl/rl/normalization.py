"""Reward / advantage normalisation with AReaL's NormConfig semantics, for variable-size groups.

`normalize(x, config, mask=..., group_ids=...)`:
  1. mean over the `mean_level` set (batch, group, or none); with `mean_leave1out` every element's
     baseline is the mean of the *other* members, (S - x_i) / (n - 1); a singleton's baseline is 0.
  2. centred values c = x - mean. A set whose valid values are all equal is centred to exactly 0
     (no rounding residue), so zero-variance groups come out as exactly 0, never NaN.
  3. std over the `std_level` set of the centred values (root of sum c^2 / n, or / (n - 1) when
     `std_unbiased`; a set with too few elements for its estimator uses std = 1); out = c / (std + eps).
     With `std_level=None` nothing is divided (and eps is not used).
Masked-out elements take no part in any statistic and come out as 0.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxwebrl.rl import segments

LEVELS = ("batch", "group", None)


@dataclasses.dataclass(frozen=True)
class NormConfig:
    """How to normalise: levels in {"batch", "group", None}. Hashable, so usable as a static jit arg."""

    mean_level: str | None = "batch"
    std_level: str | None = "batch"
    mean_leave1out: bool = False
    std_unbiased: bool = True
    eps: float = 1e-5

    def __post_init__(self):
        if self.mean_level not in LEVELS:
            raise ValueError(f"NormConfig.mean_level must be 'batch', 'group' or None, got {self.mean_level!r}")
        if self.std_level not in LEVELS:
            raise ValueError(f"NormConfig.std_level must be 'batch', 'group' or None, got {self.std_level!r}")
        if self.eps < 0:
            raise ValueError(f"NormConfig.eps must be >= 0, got {self.eps}")
        if self.mean_leave1out and self.mean_level is None:
            raise ValueError("NormConfig.mean_leave1out=True needs mean_level 'batch' or 'group'")

    @property
    def needs_groups(self) -> bool:
        return "group" in (self.mean_level, self.std_level)


def _set_sum(per_row, level, group_index, num_groups):
    """Sum a per-row quantity [N] over each row's set (whole batch or its group): [N]."""
    if level == "batch":
        return jnp.broadcast_to(per_row.sum(), per_row.shape)
    return segments.segment_sum(per_row, group_index, num_groups)[group_index]


def _set_constant(x, valid, level, group_index, num_groups):
    """[N] bool per row: all valid values of the row's set are equal (zero variance)."""
    big = jnp.finfo(jnp.float32).max
    axes = tuple(range(1, x.ndim))
    row_max = jnp.where(valid, x, -big).max(axis=axes) if axes else jnp.where(valid, x, -big)
    row_min = jnp.where(valid, x, big).min(axis=axes) if axes else jnp.where(valid, x, big)
    if level == "batch":
        return jnp.broadcast_to(row_max.max() <= row_min.min(), row_max.shape)
    gmax = segments.segment_max(row_max, group_index, num_groups)[group_index]
    gmin = segments.segment_min(row_min, group_index, num_groups)[group_index]
    return gmax <= gmin


def normalize(x, config: NormConfig | None, *, mask=None, group_ids=None, num_groups: int | None = None):
    """Normalise `x` by `config`.

    Args:
      x: [N] or [N, T] values (rewards per row, or advantages per token).
      config: NormConfig, or None for identity (returns x * mask).
      mask: same shape as x, 1/True where the element is valid; default all valid.
      group_ids: [N] integer group id per row (needed when a level is "group"); groups may have any
        size, e.g. a partially filtered group normalises within its remaining members.
      num_groups: static bound on distinct group ids (default N; see `segments.dense_ids`).

    Returns:
      float32, shape of x; 0 where mask is 0.
    """
    shape = jnp.shape(x)
    if len(shape) == 0:
        raise ValueError("normalize needs at least a 1-D array [N] or [N, T]")
    if mask is not None and jnp.shape(mask) != shape:
        raise ValueError(f"mask shape {jnp.shape(mask)} != x shape {shape}")
    if config is not None and config.needs_groups:
        if group_ids is None:
            raise ValueError("NormConfig uses level 'group': pass group_ids [N] (one id per row)")
        if jnp.shape(group_ids) != shape[:1]:
            raise ValueError(f"group_ids shape {jnp.shape(group_ids)} must be [N] = {shape[:1]}")
        if num_groups is not None and segments.is_concrete(group_ids):
            segments.check_num_segments(group_ids, num_groups)
        group_ids = segments.host_dense_ids(segments.as_arrays(group_ids))   # 64-bit ids never merge under jit
    else:
        group_ids = None
    return _normalize(x, mask, group_ids, config, num_groups)


@functools.partial(jax.jit, static_argnames=("config", "num_groups"))
def _normalize(x, mask, group_ids, config, num_groups):
    x = jnp.asarray(x, jnp.float32)
    valid = jnp.ones(x.shape, bool) if mask is None else jnp.asarray(mask).astype(bool)
    m = valid.astype(jnp.float32)
    if config is None:
        return x * m
    group_index = None
    if config.needs_groups:
        group_index, num_groups = segments.dense_ids(group_ids, num_groups)

    def bcast(per_row):
        return segments.broadcast_rows(per_row, x)

    # 1. mean
    if config.mean_level is None:
        centred = x * m
    else:
        row_sum, row_cnt = segments.row_reduce(x, m)
        s = bcast(_set_sum(row_sum, config.mean_level, group_index, num_groups))
        n = bcast(_set_sum(row_cnt, config.mean_level, group_index, num_groups))
        if config.mean_leave1out:
            others = n - m
            loo = (s - x * m) / jnp.maximum(others, 1.0)
            mean = jnp.where(others >= 1.0, loo, 0.0)  # singleton: baseline 0
            exact_zero = (n >= 2.0) & bcast(
                _set_constant(x, valid, config.mean_level, group_index, num_groups))
        else:
            mean = s / jnp.maximum(n, 1.0)
            exact_zero = bcast(_set_constant(x, valid, config.mean_level, group_index, num_groups))
        centred = jnp.where(exact_zero, 0.0, (x - mean) * m)
    # 2. std
    if config.std_level is None:
        return centred * m
    row_sq, row_cnt = segments.row_reduce(centred * centred, m)
    ss = bcast(_set_sum(row_sq, config.std_level, group_index, num_groups))
    n = bcast(_set_sum(row_cnt, config.std_level, group_index, num_groups))
    if config.std_unbiased:
        std = jnp.where(n > 1.0, jnp.sqrt(ss / jnp.maximum(n - 1.0, 1.0)), 1.0)
    else:
        std = jnp.where(n > 0.0, jnp.sqrt(ss / jnp.maximum(n, 1.0)), 1.0)
    return jnp.where(valid, centred / (std + config.eps), 0.0)
