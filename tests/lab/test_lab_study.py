"""The study's runner and its verdict table: the rules docs/learning.md fixed (held / not held / unresolved),
paired differences over seeds from records, the chunk state's round trip, and (slow) the runner at its smallest
size end to end, resumable by record."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import lab_study
import lab_table

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_verdict_rules():
    def iv(mean, half):
        return {"mean": mean, "ci95": half, "mde": half, "n": 50}
    assert lab_table.verdict(iv(-1.0, 0.5), -1, 0.5) == "held"
    assert lab_table.verdict(iv(1.0, 0.5), -1, 0.5) == "not held"
    assert lab_table.verdict(iv(0.05, 0.2), -1, 0.5) == "not held"        # an effect of interest ruled out
    assert lab_table.verdict(iv(-0.3, 0.5), -1, 0.5) == "unresolved"
    assert lab_table.verdict(iv(-1.0, 0.5), 0, 2.0) == "held"             # non-inferior at a 2-point margin
    assert lab_table.verdict(iv(-4.0, 1.0), 0, 2.0) == "not held"
    assert lab_table.verdict(iv(-2.0, 1.0), 0, 2.0) == "unresolved"
    assert lab_table.verdict({"mean": 1.0, "ci95": None, "mde": None, "n": 1}, 1, 2.0) == "unresolved"


def test_interval_is_a_t_interval():
    out = lab_table.interval([1.0, 2.0, 3.0, None, float("nan")])
    assert out["n"] == 3 and out["mean"] == pytest.approx(2.0)
    assert out["ci95"] == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)
    assert out["mde"] > out["ci95"]


def _record(ratio, arm, values: dict):
    return {"experiment": {"ratio": ratio, "arm": arm, "seeds": list(range(50))},
            "per_seed": {k: {"last50": list(v)} for k, v in values.items()}}


def test_table_pairs_seeds_and_marks_each_prediction(tmp_path):
    rng = np.random.default_rng(0)
    base = {k: rng.normal(5, 1, 50) for k in ("failure_steps", "memory_tokens")}
    base["success"], base["clip_ratio"] = rng.uniform(0.2, 0.6, 50), rng.uniform(0, 0.05, 50)
    for ratio, gain in ((1.0, 0.0), (4.0, 0.05)):
        noise = rng.normal(0, 0.01, 50)
        arm = {"failure_steps": base["failure_steps"] - 1 + noise, "memory_tokens": base["memory_tokens"] + noise,
               "success": base["success"] + gain + noise / 10, "clip_ratio": base["clip_ratio"] + 0.01}
        for name, values in (("constT10", arm), ("grpo", base)):
            with open(tmp_path / f"ratio{ratio:g}_{name}.json", "w") as f:
                json.dump(_record(ratio, name, values), f)
    rows = {(r["prediction"].split()[0], r["ratio"]): r for r in lab_table.table(lab_table.load(str(tmp_path)))}
    assert rows[("P1", 4.0)]["verdict"] == "held" and rows[("P1", 4.0)]["mean"] == pytest.approx(-1, abs=0.01)
    assert rows[("P2", 4.0)]["verdict"] == "not held"       # identical memory: the 0.1-token effect is ruled out
    assert rows[("P3", 1.0)]["verdict"] == "held" and rows[("P5", 1.0)]["verdict"] == "not held"
    assert rows[("P4", "4.0 vs 1.0")]["verdict"] == "held"
    assert rows[("P4", "4.0 vs 1.0")]["mean"] == pytest.approx(5.0, abs=0.1)
    assert "| P1 shorter failures | 4.0 |" in lab_table.markdown(list(rows.values()))


def test_table_refuses_records_that_are_not_paired(tmp_path):
    """Arms pair by seed number only when they ran the same experiment: other seeds, updates or setup refuse,
    naming the key; the arm's recipe and, across ratios, the environment may differ."""
    values = {k: np.full(50, 0.5) for k in ("failure_steps", "memory_tokens", "success", "clip_ratio")}
    records = {}
    for ratio in (1.0, 4.0):
        for arm in ("constT10", "grpo"):
            record = _record(ratio, arm, values)
            record["experiment"].update(updates=200, env={"ratio": ratio}, recipe={"k": arm})
            records[(ratio, arm)] = record
    assert len(lab_table.table(records)) == 9
    records[(4.0, "grpo")]["experiment"]["updates"] = 100
    with pytest.raises(SystemExit, match="grpo at ratio 4.0 differ in updates: not paired"):
        lab_table.table(records)
    records[(4.0, "grpo")]["experiment"].update(updates=200, seeds=list(range(1, 51)))
    with pytest.raises(SystemExit, match="differ in seeds"):
        lab_table.table(records)


def test_partial_state_round_trip(tmp_path):
    state = {"a": jnp.arange(3.0), "b": (jnp.ones((2, 2), jnp.int32),)}
    partial = lab_study.Partial(str(tmp_path), "ratio1_grpo")
    partial.save(state, {"experiment": {"k": 1}, "done": 5})
    loaded, meta = partial.load({"k": 1}, state)
    np.testing.assert_array_equal(loaded["b"][0], state["b"][0])
    assert meta["done"] == 5 and partial.load({"k": 2}, state) is None
    partial.remove()
    assert partial.load({"k": 1}, state) is None


@pytest.mark.slow   # compiles the whole program for two arms: minutes on the loaded 2-core machine
def test_study_at_its_smallest_size_records_and_resumes(tmp_path):
    cmd = [sys.executable, os.path.join(REPO, "bench", "lab_study.py"), "--tiny", "--seeds=2", "--updates=2",
           "--chunk=1", "--ratios=2", "--arms=constT10,grpo", f"--out={tmp_path / 'out'}",
           f"--state_dir={tmp_path / 'state'}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    with open(tmp_path / "out" / "ratio2_constT10.json") as f:
        record = json.load(f)
    assert record["resumed"] == 0 and record["commit"] and "lab_study.py" in record["command"]
    assert len(record["per_seed"]["success"]["last50"]) == 2 and record["experiment"]["horizons"] == [4, 6]
    again = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    assert again.count("recorded, skipping") == 2
    table = subprocess.run([sys.executable, os.path.join(REPO, "bench", "lab_table.py"),
                            f"--records={tmp_path / 'out'}"], check=True, capture_output=True, text=True).stdout
    assert "| P1 shorter failures | 2.0 |" in table
