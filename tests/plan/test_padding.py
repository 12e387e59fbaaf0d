"""The update's padding fraction for the planner's row model (jaxwebrl/plan/padding.py)."""

import numpy as np
import pytest

from jaxwebrl.plan.padding import padding_fraction, row_mix
from jaxwebrl.plan.planning import Workload


def test_row_mix_is_the_expectation_of_sampled_episodes():
    """The exact row mix equals the mean of 20,000 episodes drawn from the fleet model's EpisodeMix (rows of 1, 2
    and 3 rounds: 1,299, 2,342 and 3,385 tokens) to sampling error, and its rows an episode are its mean steps."""
    workload = Workload()
    mix = row_mix(workload, prompt_window=2)
    assert sorted(mix) == [1299, 2342, 3385]
    assert sum(mix.values()) == pytest.approx(workload.episodes().mean_steps())
    rng, counts, n = np.random.default_rng(0), dict.fromkeys(mix, 0), 20_000
    for _ in range(n):
        steps, _ = workload.episodes().draw(rng)
        for step in range(steps):
            counts[1299 + min(step, 2) * 1043] += 1
    for tokens, expected in mix.items():
        assert counts[tokens] / n == pytest.approx(expected, rel=0.03)


def test_padding_fraction_of_each_layout_by_hand():
    """Rows of 200 (half), 100 and 90 tokens (a quarter each), buckets 224, 112 and 96: batch pads all to 224; two
    groups (224, 112); four groups (224, 224, 112, 96), here the per-row floor too."""
    mix = {100: 1.0, 200: 2.0, 90: 1.0}
    real = (100 + 400 + 90) / 4
    assert padding_fraction(mix, layout="batch") == pytest.approx(1 - real / 224)
    assert padding_fraction(mix, layout="groups", groups=2) == pytest.approx(1 - real / 168)
    assert padding_fraction(mix, layout="groups", groups=4) == pytest.approx(1 - real / 164)
    assert padding_fraction(mix, layout="row") == pytest.approx(1 - real / 164)
    with pytest.raises(ValueError, match="layout='packed'"):
        padding_fraction(mix, layout="packed")


def test_paper_row_mix_pads_under_15_percent_with_the_default_length_groups():
    """The paper mix: 14.4% padding when every row pads to the batch's longest, 11.2% in the paper recipe's 8 length
    groups (configs/base.py train.length_groups), 6.3% at the per-row floor."""
    from configs.constT10 import get_config
    mix = row_mix(Workload(), prompt_window=2)
    groups = int(get_config("qwen3vl_8b").train.length_groups)
    assert groups == 8
    before, after = padding_fraction(mix, layout="batch"), padding_fraction(mix, layout="groups", groups=groups)
    assert before == pytest.approx(0.1438, abs=5e-4)
    assert after == pytest.approx(0.1121, abs=5e-4) and after <= 0.15
    assert padding_fraction(mix, layout="row") == pytest.approx(0.0626, abs=5e-4)


def test_the_committed_padding_json_is_what_bench_update_padding_prints():
    """docs/results/update_padding.json (docs/scaling.md's padding figures) is reproduced by its command: the
    expectations and the seeded draws through the update's LengthLayouts."""
    import json
    import os
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    printed = subprocess.run([sys.executable, os.path.join(repo, "bench", "update_padding.py")], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": repo}).stdout
    with open(os.path.join(repo, "docs", "results", "update_padding.json"), encoding="utf-8") as f:
        assert json.loads(printed) == json.load(f)
