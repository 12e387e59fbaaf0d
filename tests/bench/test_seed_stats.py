"""bench/seed_stats.py against values computed by hand (in the comments)."""

import json
import math

import pytest
import seed_stats
from seed_stats import arm_differences, binomial_se, mean_se, seed_summary


def test_binomial_se():
    assert binomial_se(0.5, 100) == pytest.approx(0.05)        # sqrt(0.25 / 100)
    assert binomial_se(0.2, 25) == pytest.approx(0.08)         # sqrt(0.16 / 25)
    assert binomial_se(1.0, 40) == 0.0
    assert binomial_se(0.5, None) is None and binomial_se(0.5, 0) is None


def test_mean_se_uses_the_sample_std():
    mean, se = mean_se([0.5, 0.6, 0.7])                        # var = (0.01 + 0 + 0.01) / 2 = 0.01
    assert mean == pytest.approx(0.6) and se == pytest.approx(0.1 / math.sqrt(3))
    assert mean_se([1, 3]) == pytest.approx((2.0, 1.0))         # var = 2 / 1, se = sqrt(2 / 2)
    assert mean_se([0.4]) == (0.4, None)
    assert mean_se([]) == (None, None)


SFT = {"success": 0.5, "episodes": 100, "tasks": {"a": 0.4, "b": 0.6}, "task_episodes": {"a": 50, "b": 50}}
RL = [{"success": 0.6, "episodes": 100, "tasks": {"a": 0.5, "b": 0.7}},
      {"success": 0.5, "episodes": 100, "tasks": {"a": 0.3, "b": 0.7}},
      {"success": 0.7, "episodes": 100, "tasks": {"a": 0.6, "b": 0.8}}]


def test_seed_summary_by_hand():
    s = seed_summary(SFT, RL)
    assert s["seeds"] == 3 and s["rl_success"] == [0.6, 0.5, 0.7]
    assert s["rl_success_mean"] == pytest.approx(0.6) and s["rl_success_se"] == pytest.approx(0.1 / math.sqrt(3))
    assert s["diffs"] == pytest.approx([0.1, 0.0, 0.2])
    assert s["diff_mean"] == pytest.approx(0.1) and s["diff_se"] == pytest.approx(0.1 / math.sqrt(3))
    assert s["diff_in_se"] == pytest.approx(math.sqrt(3))
    assert s["rl_beats_sft"] == 2                               # a tie (seed 1) is not a win
    assert s["diff_se_incl_sft_eval"] == pytest.approx(math.sqrt(0.01 / 3 + 0.05 ** 2))
    assert s["eval_se"]["sft"] == pytest.approx(0.05)          # sqrt(0.5 * 0.5 / 100)
    assert s["eval_se"]["rl_mean_rate"] == pytest.approx(math.sqrt(0.6 * 0.4 / 100))
    a, b = s["tasks"]["a"], s["tasks"]["b"]
    assert a["diffs"] == pytest.approx([0.1, -0.1, 0.2]) and a["diff_mean"] == pytest.approx(0.2 / 3)
    assert a["diff_se"] == pytest.approx(math.sqrt(0.07 / 3 / 3))  # squared deviations sum to 0.14/3, / (N-1) / N
    assert b["diff_mean"] == pytest.approx(0.4 / 3) and b["diff_se"] == pytest.approx(1 / 30)
    assert a["eval_se_sft"] == pytest.approx(math.sqrt(0.4 * 0.6 / 50)) and a["episodes"] == 50
    json.dumps(s, allow_nan=False)                              # JSON-clean: no NaN anywhere


def test_one_seed_has_no_spread_and_no_sft_means_no_differences():
    s = seed_summary(SFT, RL[:1])
    assert s["diff_mean"] == pytest.approx(0.1) and s["diff_se"] is None and s["diff_in_se"] is None
    assert s["diff_se_incl_sft_eval"] is None and s["tasks"]["a"]["diff_se"] is None
    json.dumps(s, allow_nan=False)
    s = seed_summary(None, RL)
    assert "diffs" not in s and s["rl_success_mean"] == pytest.approx(0.6)


def test_arm_differences():
    d = arm_differences({"x": [0.6, 0.8], "y": [0.5, 0.5], "z": [0.9]})
    assert list(d) == ["x - y", "x - z", "y - z"]
    assert d["x - y"]["diff_mean"] == pytest.approx(0.2)
    assert d["x - y"]["diff_se"] == pytest.approx(0.1)          # sqrt(0.02 / 2) and 0 in quadrature
    assert d["x - y"]["diff_in_se"] == pytest.approx(2.0)
    assert d["x - z"]["diff_mean"] == pytest.approx(-0.2) and d["x - z"]["diff_se"] is None
    assert seed_stats.quadrature(0.3, 0.4) == pytest.approx(0.5)


def test_run_dynamics_by_hand():
    curve = [{"step": 1, "staleness": 0.0, "behave_kl": 0.0, "kl": 0.10, "clip": 0.2, "time": 100.0},
             {"step": 2, "staleness": 1.0, "behave_kl": 0.3, "kl": 0.30, "clip": 0.1, "time": 120.0},
             {"step": 3, "staleness": 2.0, "behave_kl": 0.6, "kl": None, "clip": 0.3, "time": 150.0}]
    d = seed_stats.run_dynamics(curve)
    assert d["behave_kl_mean"] == pytest.approx(0.3)
    assert d["staleness_mean"] == pytest.approx(1.0) and d["kl_mean"] == pytest.approx(0.2)   # the None is skipped
    assert d["kl_max"] == pytest.approx(0.3) and d["clip_mean"] == pytest.approx(0.2)
    assert d["s_per_update"] == pytest.approx(25.0)                                         # (150 - 100) / 2
    assert d["train_steps_success"] is None and d["train_failure_success_ratio"] is None      # no batch lengths
    lengths = seed_stats.run_dynamics([{"steps_success": 4.0, "steps_failure": 10.0},
                                       {"steps_success": 6.0, "steps_failure": None}, {"steps_failure": 14.0}])
    assert (lengths["train_steps_success"], lengths["train_steps_failure"]) == (5.0, 12.0)   # means of what is there
    assert lengths["train_failure_success_ratio"] == pytest.approx(12.0 / 5.0)               # of the means
    old = seed_stats.run_dynamics([{"step": 1, "success": 0.5}])                            # a curve of before
    assert all(v is None for v in old.values()) and set(old) == set(seed_stats.DYNAMICS)


def test_dynamics_summary_correlates_with_the_gain():
    runs = [{"staleness_mean": s, "behave_kl_mean": 0.2, "kl_mean": 0.1, "kl_max": None, "clip_mean": c,
             "s_per_update": 20.0}
            for s, c in ((1.0, 0.1), (2.0, 0.3), (3.0, 0.2))]
    out = seed_stats.dynamics_summary(runs, [0.3, 0.2, 0.1])
    assert out["staleness_mean"]["mean"] == pytest.approx(2.0) and out["staleness_mean"]["se"] == pytest.approx(
        1 / math.sqrt(3))
    assert out["staleness_mean"]["r_with_gain"] == pytest.approx(-1.0)    # staler seeds gained less, exactly
    assert out["clip_mean"]["r_with_gain"] == pytest.approx(-0.5)         # deviations (-1,1,0)·(1,0,-1) / (sqrt2 sqrt2)
    assert out["kl_mean"]["r_with_gain"] is None                          # constant: no correlation
    assert out["kl_max"]["mean"] is None and out["kl_max"]["r_with_gain"] is None
    assert seed_stats.pearson([1, 2], [3, 4]) is None                      # fewer than 3 pairs
    json.dumps(out, allow_nan=False)


def test_pool_evals_by_hand():
    a = {"success": 0.5, "episodes": 100, "tasks": {"x": 0.4, "y": 0.6}, "task_episodes": {"x": 50, "y": 50},
         "eval_seeds": [1, 50], "steps_success": 2.0, "steps_failure": 4.0}
    b = {"success": 0.7, "episodes": 100, "tasks": {"x": 0.6, "y": 0.8}, "task_episodes": {"x": 50, "y": 50},
         "eval_seeds": [1, 50], "steps_success": 3.0, "steps_failure": 5.0}
    pooled = seed_stats.pool_evals([a, b])
    assert pooled["success"] == pytest.approx(0.6) and pooled["episodes"] == 200 and pooled["evals"] == 2
    assert pooled["tasks"] == pytest.approx({"x": 0.5, "y": 0.7}) and pooled["task_episodes"] == {"x": 100, "y": 100}
    assert pooled["steps_success"] == pytest.approx((2.0 * 50 + 3.0 * 70) / 120)    # weighted by successes
    assert pooled["steps_failure"] == pytest.approx((4.0 * 50 + 5.0 * 30) / 80)     # and by failures
    assert pooled["success_each"] == [0.5, 0.7] and pooled["eval_seeds"] == [1, 50]
    assert binomial_se(pooled["success"], pooled["episodes"]) < binomial_se(0.6, 100)
    with pytest.raises(ValueError, match="different instances"):
        seed_stats.pool_evals([a, dict(b, eval_seeds=[1, 40])])
