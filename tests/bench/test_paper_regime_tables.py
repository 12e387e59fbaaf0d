"""bench/paper_regime_tables.py: the tables it prints hold the ablation JSON's numbers, and every figure row it
writes for docs/results.md resolves in that JSON to the value it shows (checked with tests/test_results_doc.py's own
parser and key evaluator) and quotes a line of the markdown it printed."""

import importlib.util
import json
import math
import os

import pytest

import paper_regime_tables as tables

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER_REGIME = os.path.join(REPO, "docs", "results", "paper_regime")


def _results_doc_checker():
    spec = importlib.util.spec_from_file_location("results_doc", os.path.join(REPO, "tests", "test_results_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["ablation.json", "ablation_trap.json"])   # traps off (complete), traps on
def test_every_row_it_writes_resolves_to_its_value_and_quotes_its_markdown(name):
    """Also for a stopped ablation: an arm with one seed has no SE (its rows are left out, "n/a" never shown),
    an arm with none is left out."""
    with open(os.path.join(PAPER_REGIME, name)) as f:
        data = json.load(f)
    t = tables.Tables(data, f"paper_regime/{name}", "learning-paper")
    markdown = t.markdown()
    checker = _results_doc_checker()
    lines = [checker.normalise(line) for line in markdown.splitlines()]
    names = []
    for line in t.rows:
        row = dict(zip(checker.FIGURE_COLUMNS, checker.cells(line)))
        names.append(row["figure"])
        got = checker.evaluate(data, row["key"]) * checker.scale_of(row["scale"])
        want, tolerance = checker.shown(row["value"])
        assert math.isclose(got, want, abs_tol=tolerance * (1 + 1e-9)), row
        assert row["value"] in row["quote"] and any(checker.normalise(row["quote"]) in ln for ln in lines), row
    assert len(names) == len(set(names)), "two rows share a name"
    arms = {arm: a for arm, a in data["arms"].items() if a.get("seeds")}
    assert sum(line.startswith("| SFT + ") for line in markdown.splitlines()) == len(arms)
    assert "n/a" not in markdown and "None" not in markdown
    for arm, a in arms.items():
        assert f"{arm}, seeds {', '.join(str(s['seed']) for s in a['seeds'])}:" in markdown
        se = a["summary"]["rl_success_se"]
        mean = tables.pct(a["summary"]["rl_success_mean"])
        assert (f"{mean} ± {100 * se:.1f}%" if se is not None else f"| {mean}% |") in markdown


def test_signed_points_use_a_real_minus():
    assert tables.signed(0.046) == "+4.6" and tables.signed(-0.013) == "−1.3" and tables.signed(0.0) == "+0.0"
    assert tables.signed(-1e-17) == "+0.0" and tables.signed(-0.0004) == "+0.0" and tables.signed(-0.0006) == "−0.1"


def test_the_power_plan_is_its_committed_json_and_its_arithmetic():
    """bench/power_plan.py (docs/learning.md's power calculation): the committed plan is what the script computes
    from the committed records, and its formulas are N = ceil((2 sd_d / effect)^2) and SE = sd_d / sqrt(N)."""
    import power_plan

    with open(os.path.join(PAPER_REGIME, "power", "plan.json")) as f:
        committed = json.load(f)
    committed.pop("command")
    assert json.loads(json.dumps(power_plan.plan())) == committed
    assert power_plan.seeds_needed(6.0, 4.0) == 9 and power_plan.seeds_needed(6.0, -3.7) == 11
    six = power_plan.resolves(6.0, 6)
    assert six["se"] == pytest.approx(6.0 / math.sqrt(6)) and six["two_se"] == pytest.approx(2 * six["se"])
    assert six["mde80"] == pytest.approx((2.5706 + 0.8416) * six["se"], rel=1e-3)
    assert committed["budget"]["records"] == 24 and committed["inputs"]["dof"] == 12
