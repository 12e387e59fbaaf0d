"""The committed ablation JSONs' derived figures (each arm's mean success and its SE, the RL − SFT differences, the
per-seed records, every pair of arms' difference ± SE, per split) recomputed from the JSON's own raw records (its
runs' evals and curves) by the code that wrote them (bench/ablation.py, bench/seed_stats.py): a figure edited in
the JSON, or a change to how it is computed, fails here."""

import json
import os

import pytest

import ablation

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                       "results")
# paper_regime/: the paper's regime, traps off and on (README's figures); multiseed/: the tiny default's 5 seeds.
ABLATIONS = ("paper_regime/ablation.json", "paper_regime/ablation_trap.json", "multiseed/ablation.json")


def holds(committed, recomputed, path: str = "") -> list:
    """Where `recomputed` differs from `committed` on the keys `committed` has (a JSON written before a later
    field was added still holds everything it recorded): one 'path: committed != recomputed' each."""
    if isinstance(committed, dict) and isinstance(recomputed, dict):
        return [p for k, v in committed.items()
                for p in (holds(v, recomputed[k], f"{path}.{k}") if k in recomputed else [f"{path}.{k}: missing"])]
    if isinstance(committed, list) and isinstance(recomputed, list) and len(committed) == len(recomputed):
        return [p for i, (a, b) in enumerate(zip(committed, recomputed)) for p in holds(a, b, f"{path}[{i}]")]
    if isinstance(committed, float) and isinstance(recomputed, (int, float)):
        return [] if recomputed == pytest.approx(committed, rel=1e-12, abs=1e-15) else [f"{path}: {committed} != "
                                                                                          f"{recomputed}"]
    return [] if committed == recomputed else [f"{path}: {committed!r:.60} != {recomputed!r:.60}"]


def _roundtrip(value):
    return json.loads(json.dumps(value))   # tuples as lists, keys as strings: the JSON's own types


@pytest.mark.parametrize("name", ABLATIONS)
def test_every_derived_figure_is_recomputed_from_the_runs(name):
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        data = json.load(f)
    problems = []
    for arm, record in data["arms"].items():
        summary = _roundtrip(ablation.arm_summary(data["after_sft"], record["runs"]))
        problems += holds(record["summary"], summary, f"arms.{arm}.summary")
        seeds = _roundtrip([ablation.seed_record(r) for r in record["runs"] if r["eval"]])
        problems += holds(record.get("seeds", seeds), seeds, f"arms.{arm}.seeds")
    rates = {arm: record["summary"]["rl_success"] for arm, record in data["arms"].items()}
    problems += holds(data["arm_differences"], _roundtrip(ablation.arm_differences(rates)), "arm_differences")
    if "split_differences" in data:
        problems += holds(data["split_differences"], _roundtrip(ablation.split_differences(data["arms"])),
                          "split_differences")
    assert not problems, f"docs/results/{name}: " + "; ".join(problems[:8])


def test_an_edited_figure_or_a_dropped_field_is_found():
    committed = {"mean": 0.30333333333333334, "se": 0.019, "runs": [{"s": 1}]}
    assert holds(committed, dict(committed, extra=1)) == []
    assert holds(committed, dict(committed, mean=0.31)) == [".mean: 0.30333333333333334 != 0.31"]
    assert holds(committed, {"mean": committed["mean"], "runs": [{"s": 2}]}) == [".se: missing", ".runs[0].s: 1 != 2"]
