"""The update's padding fraction on the planner's row model of the paper recipe (jaxwebrl/plan/padding.py): every
row padded to the batch's longest (the layout before length groups), the update's length groups at the recipe's
`train.length_groups` and a few other counts, and the per-row floor. Exact expectations, nothing timed.

    python3 bench/update_padding.py > docs/results/update_padding.json
"""

from __future__ import annotations

import json

from configs.constT10 import get_config
from jaxwebrl.plan.padding import padding_fraction, row_mix
from jaxwebrl.plan.planning import Workload


def main() -> None:
    config = get_config("qwen3vl_8b")
    workload, window = Workload(), int(config.env.prompt_window)
    mix = row_mix(workload, prompt_window=window)
    groups = int(config.train.length_groups)
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
    }, indent=1))


if __name__ == "__main__":
    main()
