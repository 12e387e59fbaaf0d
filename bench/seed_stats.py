"""The statistics of a multi-seed learning run (bench/learning_run.py, bench/ablation.py, bench/plot_results.py).

    binomial_se(0.5, 120)                       # one eval's own noise: sqrt(p (1 - p) / n) = 0.0456
    mean_se([0.5, 0.6, 0.7])                    # (0.6, 0.0577): the mean and sample std / sqrt(N), ddof = 1
    seed_summary(sft_eval, [rl_eval_seed0, rl_eval_seed1, ...])
    arm_differences({"constT10": [0.55, 0.6], "grpo": [0.5, 0.45]})
    pool_evals([sft_eval_a, sft_eval_b])        # several evals of one policy on the same instances, as one
    run_dynamics(curve)                         # one RL run's staleness, KL, clipping and pace, from its curve
    dynamics_summary([dynamics_seed0, ...], diffs)   # their mean ± SE over seeds, and correlation with the gain

An eval summary is {"success": rate, "episodes": n, "tasks": {task: rate}, "task_episodes": {task: n}}.
The SFT warm start is ONE shared eval, so the seeds' RL − SFT differences all carry the same SFT eval error:
their spread (`diff_se`) measures the RL seeds and their evals, not it. `diff_se_incl_sft_eval` adds the SFT
eval's binomial SE in quadrature. Standard errors of fewer than two values are None (JSON null), never NaN.
"""

from __future__ import annotations

import itertools
import math


def binomial_se(p: float, n: int | None) -> float | None:
    """Standard error of a success rate `p` measured on `n` independent episodes (None without n)."""
    if not n:
        return None
    return math.sqrt(p * (1.0 - p) / n)


def mean_se(values) -> tuple[float | None, float | None]:
    """(mean, sample std with ddof=1 / sqrt(N)); the SE is None for N < 2, both are None for N = 0."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def in_se(mean: float | None, se: float | None) -> float | None:
    """mean / se (how many standard errors from zero); None when either is missing or se is 0."""
    if mean is None or not se:
        return None
    return mean / se


def quadrature(*ses: float | None) -> float | None:
    """sqrt(sum of squares): the SE of a sum or difference of independent estimates (None if any is None)."""
    if any(se is None for se in ses):
        return None
    return math.sqrt(sum(se * se for se in ses))


def seed_summary(sft: dict | None, rl: list[dict], dynamics: list[dict] | None = None) -> dict:
    """Mean RL success over seeds and, with the SFT eval, every seed's RL − SFT difference, its mean ± SE, the
    seeds where RL beat SFT, per task, and each eval's own binomial noise (see the module docstring); with the
    seeds' `run_dynamics` (one per eval in `rl`), their `dynamics_summary` against those differences."""
    out = _seed_summary(sft, rl)
    if dynamics is not None:
        out["dynamics"] = dynamics_summary(dynamics, out.get("diffs"))
    return out


def _seed_summary(sft: dict | None, rl: list[dict]) -> dict:
    rates = [r["success"] for r in rl]
    rl_mean, rl_se = mean_se(rates)
    episodes = [r.get("episodes") for r in rl]
    out = {"seeds": len(rl), "rl_success": rates, "rl_success_mean": rl_mean, "rl_success_se": rl_se,
           "eval_se": {"rl_mean_rate": binomial_se(rl_mean, episodes[0]) if rl else None,
                       "episodes": episodes[0] if rl else None}}
    if sft is None:
        return out
    diffs = [r - sft["success"] for r in rates]
    diff_mean, diff_se = mean_se(diffs)
    sft_eval_se = binomial_se(sft["success"], sft.get("episodes"))
    out.update(sft_success=sft["success"], diffs=diffs, diff_mean=diff_mean, diff_se=diff_se,
               diff_in_se=in_se(diff_mean, diff_se), rl_beats_sft=sum(d > 0 for d in diffs),
               diff_se_incl_sft_eval=quadrature(diff_se, sft_eval_se))
    out["eval_se"]["sft"] = sft_eval_se
    tasks = {}
    for task, sft_rate in sorted(sft.get("tasks", {}).items()):
        task_diffs = [r["tasks"][task] - sft_rate for r in rl if task in r.get("tasks", {})]
        mean, se = mean_se(task_diffs)
        n = (sft.get("task_episodes") or {}).get(task)
        tasks[task] = {"sft": sft_rate, "diffs": task_diffs, "diff_mean": mean, "diff_se": se,
                       "eval_se_sft": binomial_se(sft_rate, n), "episodes": n}
    out["tasks"] = tasks
    return out


def pool_evals(evals: list[dict]) -> dict:
    """Several eval summaries of ONE policy on the same held-out instances (independent draws: other sampling
    seeds, or unseeded) as one eval of all their episodes: rates weighted by episodes, so the pooled binomial SE
    shrinks as sqrt(1 / evals). A shared warm start's eval error is carried by every seed's difference; pooling is
    how to make it small. ValueError when they played different instances."""
    if len({tuple(e.get("eval_seeds") or ()) for e in evals}) > 1:
        raise ValueError(f"pool_evals: the evals played different instances: {[e.get('eval_seeds') for e in evals]}")

    def weighted(rates, counts):
        pairs = [(r, n) for r, n in zip(rates, counts) if r is not None and n]
        total = sum(n for _, n in pairs)
        return sum(r * n for r, n in pairs) / total if total else None

    episodes = [e.get("episodes") or 0 for e in evals]
    wins = [e["success"] * n for e, n in zip(evals, episodes)]
    tasks = sorted({t for e in evals for t in e.get("tasks", {})})
    task_episodes = {t: [(e.get("task_episodes") or {}).get(t) or 0 for e in evals] for t in tasks}
    return {"success": weighted([e["success"] for e in evals], episodes), "episodes": sum(episodes),
            "tasks": {t: weighted([e["tasks"].get(t) for e in evals], task_episodes[t]) for t in tasks},
            "task_episodes": {t: sum(n) for t, n in task_episodes.items()}, "eval_seeds": evals[0].get("eval_seeds"),
            "steps_success": weighted([e.get("steps_success") for e in evals], wins),
            "steps_failure": weighted([e.get("steps_failure") for e in evals],
                                      [n - w for n, w in zip(episodes, wins)]),
            "evals": len(evals), "success_each": [e["success"] for e in evals]}


def arm_differences(arms: dict[str, list[float]]) -> dict[str, dict]:
    """For every pair of arms "a - b": the difference of their mean success over seeds and its SE (the arms'
    seeds are independent runs, so the SEs add in quadrature; None when an arm has fewer than two seeds)."""
    out = {}
    for a, b in itertools.combinations(arms, 2):
        mean_a, se_a = mean_se(arms[a])
        mean_b, se_b = mean_se(arms[b])
        if mean_a is None or mean_b is None:
            continue
        diff, se = mean_a - mean_b, quadrature(se_a, se_b)
        out[f"{a} - {b}"] = {"diff_mean": diff, "diff_se": se, "diff_in_se": in_se(diff, se)}
    return out


DYNAMICS = ("staleness_mean", "behave_kl_mean", "kl_mean", "kl_max", "clip_mean", "s_per_update",
            "train_steps_success", "train_steps_failure", "train_failure_success_ratio")


def run_dynamics(curve: list[dict]) -> dict:
    """One RL run's trained-batch dynamics from its curve (bench/learning_run.py `curve`: one row an update with
    staleness, behave_kl, kl, clip and time): mean staleness (versions), mean |log prox − log behave| (how far the
    trained episodes' behaviour policy was from the policy they train), mean and max |log new − log prox| (the
    update's step), mean clipped fraction, seconds an update after the first, and the trained batches' mean steps of
    successes and of failures and their ratio (None where the curve lacks it)."""
    def values(key):
        return present(curve, key)

    staleness, kl, clip, times = values("staleness"), values("kl"), values("clip"), values("time")
    return {"staleness_mean": mean_se(staleness)[0], "behave_kl_mean": mean_se(values("behave_kl"))[0],
            "kl_mean": mean_se(kl)[0], "kl_max": max(kl, default=None),
            "clip_mean": mean_se(clip)[0],
            "s_per_update": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
            **train_lengths(curve)}


def train_lengths(curve: list[dict]) -> dict:
    """The trained batches' mean steps of successes and of failures over a run's updates, and failures over
    successes: the length ratio the 1/k and 1/|τ| normalisers weigh (the eval's is the final policy's, greedy)."""
    success, failure = mean_se(present(curve, "steps_success"))[0], mean_se(present(curve, "steps_failure"))[0]
    return {"train_steps_success": success, "train_steps_failure": failure,
            "train_failure_success_ratio": failure / success if success and failure else None}


def present(curve: list[dict], key: str) -> list:
    """The curve's values of `key`, rows that lack it (or hold None) skipped."""
    return [row[key] for row in curve if row.get(key) is not None]


def pearson(xs, ys) -> float | None:
    """Pearson correlation of paired values; None for fewer than 3 pairs or a constant side."""
    pairs = [(float(x), float(y)) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pairs) < 3 or len({x for x, _ in pairs}) < 2 or len({y for _, y in pairs}) < 2:
        return None
    mx, my = (sum(v) / len(pairs) for v in zip(*pairs))
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x, _ in pairs), sum((y - my) ** 2 for _, y in pairs)
    return sxy / math.sqrt(sxx * syy)


def dynamics_summary(dynamics: list[dict], diffs: list[float] | None = None) -> dict:
    """Per `DYNAMICS` field: the values over seeds, their mean ± SE and, with the seeds' RL − SFT differences,
    the correlation with the gain across seeds (does a seed that ran staler, or took larger steps, gain less?)."""
    out = {}
    for key in DYNAMICS:
        values = [d.get(key) for d in dynamics]
        mean, se = mean_se([v for v in values if v is not None])
        out[key] = {"values": values, "mean": mean, "se": se,
                    "r_with_gain": pearson(values, diffs) if diffs else None}
    return out
