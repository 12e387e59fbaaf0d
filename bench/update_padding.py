"""The update's padding fraction on the planner's row model of the paper recipe (jaxwebrl/plan/padding.py): every
row padded to the batch's longest (the layout before length groups), the update's length groups at the recipe's
`train.length_groups` and a few other counts, and the per-row floor: exact expectations in the limit of many rows.
Then `bounded`: minibatches drawn from the same mix (seeds 0..DRAWS-1, MINIBATCHES each) through the update's own
`LengthLayouts` at the recipe's `train.length_groups` and `train.length_layouts`: the layouts each minibatch's own
widths would compile, the ones that run, and both paddings; at the recipe's rows a minibatch (its
`train.consumer_batch_size` trajectories × the mix's rows an episode ÷ `train.ppo_n_minibatches`) and at 8 rows (the
device check's train step). Nothing timed.

    python3 bench/update_padding.py > docs/results/update_padding.json
"""

from __future__ import annotations

import json

import numpy as np

from configs.constT10 import get_config
from jaxwebrl.plan.padding import padding_fraction, row_mix
from jaxwebrl.plan.planning import Workload
from jaxwebrl.train.assembly import length_bucket
from jaxwebrl.train.length_layouts import LengthLayouts, length_groups

MINIBATCHES, DRAWS = 200, 5


def bounded(mix: dict[int, float], rows: int, groups: int, max_layouts: int, seed: int) -> dict:
    """One draw: MINIBATCHES minibatches of `rows` rows from `mix` ({row tokens: weight}), T the bucket of its longest
    row, through `LengthLayouts(groups, max_layouts)`: distinct own and run layouts, and each one's padding."""
    rng = np.random.default_rng(seed)
    tokens, weights = np.array(sorted(mix)), np.array([mix[t] for t in sorted(mix)])
    width = length_bucket(int(tokens.max()), 1 << 20)
    layouts, own, run, real, padded = LengthLayouts(groups, max_layouts), set(), set(), 0, {"own": 0, "run": 0}
    for _ in range(MINIBATCHES):
        lengths = rng.choice(tokens, rows, p=weights / weights.sum())
        mine, ran = length_groups(lengths, groups, width)[1], layouts(lengths, width)[1]
        own.add(mine)
        run.add(ran)
        real += int(lengths.sum())
        padded["own"] += sum(r * w for r, w in mine)
        padded["run"] += sum(r * w for r, w in ran)
    return {"seed": seed, "T": width, "own_layouts": len(own), "layouts": len(run),
            "own_padding": 1 - real / padded["own"], "padding": 1 - real / padded["run"]}


def main() -> None:
    config = get_config("qwen3vl_8b")
    workload, window = Workload(), int(config.env.prompt_window)
    mix = row_mix(workload, prompt_window=window)
    groups, kept = int(config.train.length_groups), int(config.train.length_layouts)
    recipe_rows = round(config.train.consumer_batch_size * sum(mix.values()) / config.train.ppo_n_minibatches)
    print(json.dumps({
        "what": "padding tokens / padded row-tokens of the update for the planner's paper row mix (kind: model)",
        "prompt_window": window, "workload": {"horizons": list(workload.horizons), "success_p": workload.success_p,
                                              "response_tokens": workload.response_tokens},
        "rows_an_episode": {str(tokens): round(w, 4) for tokens, w in sorted(mix.items())},
        "length_groups": groups,
        "padding_fraction": {"batch_longest": padding_fraction(mix, layout="batch"),
                             "length_groups": padding_fraction(mix, layout="groups", groups=groups),
                             "per_row_floor": padding_fraction(mix, layout="row"),
                             "by_groups": {str(k): padding_fraction(mix, layout="groups", groups=k)
                                           for k in (1, 2, 4, 8, 16)}},
        "bounded": [{"rows": rows, "minibatches": MINIBATCHES, "length_layouts": kept,
                     "draws": [bounded(mix, rows, groups, kept, seed) for seed in range(DRAWS)]}
                    for rows in (recipe_rows, 8)],
    }, indent=1))


if __name__ == "__main__":
    main()
