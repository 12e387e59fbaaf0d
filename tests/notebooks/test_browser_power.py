"""Execute notebooks/browser_power.ipynb headless on the browser study's committed records
(docs/results/paper_regime/power2/runs): it draws each seed's paired outcomes and prints bench/ablation.py's paired
table for constT10 − grpo; the committed notebook carries the same printed outputs (a new record means re-running
`python -m tests.notebooks.run`)."""

import sys

import nbformat

from tests.notebooks.run import REPO, execute, images, printed

NAME = "browser_power.ipynb"
RECORDS = REPO / "docs" / "results" / "paper_regime" / "power2" / "runs"


def test_power_notebook_draws_the_records_and_prints_the_paired_table_of_bench_ablation():
    nb = execute(NAME, cwd=REPO / "notebooks", env={"JAXWEBRL_POWER_RECORDS": ""})
    assert images(nb) >= 1, "the notebook must draw the seeds"
    text = "".join(printed(nb))
    sys.path.insert(0, str(REPO / "bench"))
    import ablation
    arms = ablation.recorded_arms(str(RECORDS))
    assert ablation.paired_markdown(ablation.paired_differences(arms)) in text, "the table is not bench/ablation.py's"
    for arm, a in arms.items():
        assert f"{arm}: seeds {[r['seed'] for r in a['seeds']]}" in text
        assert f"warm starts {[r['warm_start'] for r in a['seeds']]}" in text
    pairs = {arm: {r["seed"]: r["warm_start"] for r in a["seeds"]} for arm, a in arms.items()}
    for seed in set(pairs.get("constT10", {})) & set(pairs.get("grpo", {})):   # a pair shares its warm start
        assert pairs["constT10"][seed] == pairs["grpo"][seed], f"seed {seed}'s pair started from two warm starts"
    committed = nbformat.read(REPO / "notebooks" / NAME, as_version=4)
    assert images(committed) >= 1
    assert printed(committed) == printed(nb), "stale outputs: run `python -m tests.notebooks.run` and commit"
