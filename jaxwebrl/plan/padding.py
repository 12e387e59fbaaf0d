"""How much of the update's row-tokens are padding, for the planner's row model of a paper-scale batch.

    mix = row_mix(Workload(), prompt_window=2)      # {row tokens: expected rows an episode}
    padding_fraction(mix, layout="batch")           # every row padded to the batch's longest (today's update)
    padding_fraction(mix, layout="groups", groups=4)  # the update's length groups (`update.length_groups`)
    padding_fraction(mix, layout="row")             # every row padded to its own length bucket (the floor)

A step's row holds min(step + 1, prompt_window + 1) rounds (a screenshot's image tokens and its text,
`planning.IMAGE_TOKENS_PER_SCREENSHOT` and `TEXT_TOKENS_PER_ROUND`) and one response. Episode lengths follow the
fleet model's `EpisodeMix` (1 + Binomial(H − 1, q)); the expectation here is exact, no sampling. Lengths pad
as the trainer pads them (`parallel.buckets.bucket` to a multiple of `assembly.LENGTH_MULTIPLE`, 16).
"""

from __future__ import annotations

import math

import numpy as np

from jaxwebrl.parallel.buckets import bucket
from jaxwebrl.plan.planning import IMAGE_TOKENS_PER_SCREENSHOT, TEXT_TOKENS_PER_ROUND, Workload

LENGTH_MULTIPLE = 16   # assembly.LENGTH_MULTIPLE (plan/ imports no JAX)
LAYOUTS = ("batch", "groups", "row")


def _steps_pmf(horizon: int, q: float) -> dict[int, float]:
    """P(steps = n) for steps = 1 + Binomial(horizon - 1, q)."""
    k = horizon - 1
    return {1 + j: math.comb(k, j) * q ** j * (1 - q) ** (k - j) for j in range(k + 1)}


def row_mix(workload: Workload, *, prompt_window: int) -> dict[int, float]:
    """{row tokens: expected rows of that length an episode} over the workload's horizon and outcome mix."""
    episodes = workload.episodes()
    per_round = IMAGE_TOKENS_PER_SCREENSHOT + TEXT_TOKENS_PER_ROUND
    mix: dict[int, float] = {}
    outcomes = ((workload.success_p, lambda h: workload.success_steps),
                (1 - workload.success_p, lambda h: episodes.failure_fraction * h))
    for horizon in workload.horizons:
        for p_outcome, mean_steps in outcomes:
            weight = p_outcome / len(workload.horizons)
            for steps, p in _steps_pmf(horizon, episodes._q(horizon, mean_steps(horizon))).items():
                for step in range(steps):
                    tokens = min(step + 1, prompt_window + 1) * per_round + workload.response_tokens
                    mix[tokens] = mix.get(tokens, 0.0) + weight * p
    return mix


def padding_fraction(mix: dict[int, float], *, layout: str, groups: int = 1) -> float:
    """Padding tokens ÷ padded tokens of a batch drawn from `mix` ({row tokens: weight}), in the limit of many rows
    (a paper-scale minibatch holds hundreds).

    layout "batch": every row pads to the bucket of the longest row; "groups": the rows, longest first, in `groups`
    chunks of equal row count, each padded to the bucket of its longest row (the update's `length_groups`);
    "row": each row pads to its own bucket."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: use one of {LAYOUTS}")
    rows = sum(mix.values())
    real = sum(tokens * w for tokens, w in mix.items()) / rows
    if layout == "batch":
        padded = bucket(max(mix), LENGTH_MULTIPLE)
    elif layout == "row":
        padded = sum(bucket(tokens, LENGTH_MULTIPLE) * w for tokens, w in mix.items()) / rows
    else:   # chunk i covers the quantiles [i/groups, (i+1)/groups) of the rows sorted longest first
        longest_first = sorted(mix.items(), reverse=True)
        edges = np.cumsum([w / rows for _, w in longest_first])        # quantile where each length ends
        padded = float(np.mean([bucket(longest_first[int(np.searchsorted(edges, i / groups, side="right"))][0],
                                       LENGTH_MULTIPLE) for i in range(groups)]))
    return 1.0 - real / padded
