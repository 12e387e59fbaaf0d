"""Step 2 of the advantage path: one normalised reward r̂_e per episode, by a named estimator (a registry).

    r_hat = get_estimator("grpo")(episode_rewards, group_index, valid, std_unbiased=False, eps=1e-5)   # [E]
    register_estimator("my_estimator", fn, reward_norm=("group", None, False))      # actor.estimator = "my_estimator"

Built in: grpo (group mean and std), drgrpo (group mean), rloo (leave-one-out group mean), liteppo (group mean,
batch std), batch, raw / ppo (no normalisation), gae (no normalisation; the critic's values are the baseline, in
GAE), success_filter / fbc / raft (RAFT++: 1 on success, 0 otherwise).
Each is registered with the `actor.reward_norm` levels it implies, so a run config that names one and writes the
normalisation the paper's way (`reward_norm.mean_level/std_level/mean_leave1out`) is checked to agree, and with
how it uses a critic's values (`critic_use`: "needed", "optional" or "ignored"), so a value model is configured
exactly where one is read.
Pure jnp; `advantages.py` runs the whole path.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxwebrl.rl.normalization import NormConfig, normalize


def normalized_episode_rewards(episode_rewards, group_index, valid, *, norm: NormConfig | None):
    """Estimator core: NormConfig normalisation of episode rewards [E] within groups. [E] float32."""
    return normalize(episode_rewards, norm, mask=valid, group_ids=group_index)


def success_filter(episode_rewards, group_index, valid):
    """RAFT++ / fbc: r̂_e = 1 for successful episodes (r > 0), 0 otherwise; no group baseline."""
    del group_index
    return jnp.where(valid & (jnp.asarray(episode_rewards) > 0), 1.0, 0.0).astype(jnp.float32)


def _norm_estimator(mean_level, std_level, leave1out=False):
    def estimator(episode_rewards, group_index, valid, *, std_unbiased=False, eps=1e-5):
        cfg = NormConfig(mean_level=mean_level, std_level=std_level, mean_leave1out=leave1out,
                         std_unbiased=std_unbiased, eps=eps)
        return normalized_episode_rewards(episode_rewards, group_index, valid, norm=cfg)
    estimator.__doc__ = (f"NormConfig(mean_level={mean_level!r}, std_level={std_level!r}, "
                         f"mean_leave1out={leave1out}) on episode rewards [E] -> r̂ [E] float32.")
    return estimator


def _raw_estimator(episode_rewards, group_index, valid, **_):
    """No normalisation (critic-based PPO, or rewards that are already advantages)."""
    del group_index
    return jnp.where(valid, jnp.asarray(episode_rewards, jnp.float32), 0.0)


# Registry: name -> (estimator, the reward_norm levels (mean_level, std_level, mean_leave1out) it implies). A run
# config writes the reward normalisation the way the paper and AReaL do (`actor.reward_norm`) and names the
# estimator; the two must agree (train/rl_config.py checks it).
_ESTIMATORS: dict = {}


CRITIC_USES = ("needed", "optional", "ignored")


def register_estimator(name: str, fn, *, reward_norm: tuple, critic: str = "ignored") -> None:
    """Make `name` an advantage estimator every recipe can name (`actor.estimator`).

    fn(episode_rewards [E], group_index [E], valid [E] bool, *, std_unbiased: bool, eps: float) -> r̂ [E] float32:
    one normalised reward per episode (E is a static bound: rows of the batch; `valid` marks real episodes, and
    `group_index` [E] int32 holds each episode's dense group id). Pure jnp: it runs inside the jitted advantage path.
    reward_norm: the `actor.reward_norm` levels (mean_level, std_level, mean_leave1out) it implies, e.g.
    ("group", "group", False) for GRPO, (None, None, False) for an estimator that normalises nothing itself.
    critic: "needed" (its r̂ is meant to be baselined by a value model's values in GAE), "optional" (works with or
    without one) or "ignored" (it has its own baseline: a value model would be a second one).
    Registering the same estimator again is a no-op; another one under a taken name is a ValueError.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"estimator name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"register_estimator({name!r}, ...): the estimator must be callable")
    mean, std, leave1out = reward_norm
    levels = ("group", "batch", None)
    if mean not in levels or std not in levels or not isinstance(leave1out, bool):
        raise ValueError(f"register_estimator({name!r}, ...): reward_norm=(mean_level, std_level, mean_leave1out) "
                         f"with levels in {levels} and a bool, got {reward_norm!r}")
    if critic not in CRITIC_USES:
        raise ValueError(f"register_estimator({name!r}, ...): critic={critic!r}, use one of {CRITIC_USES}")
    entry = (fn, (mean, std, leave1out), critic)
    if _ESTIMATORS.get(name, entry) != entry:
        raise ValueError(f"advantage estimator {name!r} is already registered: choose another name")
    _ESTIMATORS[name] = entry


def _success_filter_estimator(r, g, v, **_):
    return success_filter(r, g, v)


for _name, _fn, _norm, _critic in (
        ("grpo", _norm_estimator("group", "group"), ("group", "group", False), "ignored"),   # the paper's reward_norm
        ("drgrpo", _norm_estimator("group", None), ("group", None, False), "ignored"),       # mean only
        ("rloo", _norm_estimator("group", None, leave1out=True), ("group", None, True), "ignored"),
        ("liteppo", _norm_estimator("group", "batch"), ("group", "batch", False), "ignored"),
        ("batch", _norm_estimator("batch", "batch"), ("batch", "batch", False), "ignored"),
        ("raw", _raw_estimator, (None, None, False), "optional"),
        ("ppo", _raw_estimator, (None, None, False), "optional"),
        ("gae", _raw_estimator, (None, None, False), "needed"),     # critic PPO: V is the baseline
        # RAFT++ / fbc: r̂ = 1 on success, 0 otherwise; no reward normalisation
        ("success_filter", _success_filter_estimator, (None, None, False), "ignored"),
        ("fbc", _success_filter_estimator, (None, None, False), "ignored"),
        ("raft", _success_filter_estimator, (None, None, False), "ignored")):
    register_estimator(_name, _fn, reward_norm=_norm, critic=_critic)
del _name, _fn, _norm, _critic


def get_estimator(name: str):
    """Episode-level advantage estimator by name:
    f(episode_rewards [E], group_index [E], valid [E], **kw) -> r̂ [E] float32."""
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name][0]


def implied_reward_norm(name: str) -> tuple:
    """The (mean_level, std_level, mean_leave1out) of `actor.reward_norm` estimator `name` implies."""
    get_estimator(name)
    return _ESTIMATORS[name][1]


def critic_use(name: str) -> str:
    """How estimator `name` uses a value model's values: "needed", "optional" or "ignored" (`register_estimator`)."""
    get_estimator(name)
    return _ESTIMATORS[name][2]


def estimator_names():
    return sorted(_ESTIMATORS)
