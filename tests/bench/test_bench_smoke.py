"""bench/rl_core.py and bench/buffer.py run for real at their smallest size: the JSON they print has its keys, both
arms of every ratio were measured, and each ratio is the one of its arms."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_bench(name: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", name), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_rl_core_smallest_run_measures_both_arms_and_agrees_with_numpy():
    out = run_bench("rl_core.py", "--rows", "2", "--tokens", "64", "--repeats", "1")
    assert {"rows", "tokens", "policy_tokens", "repeats", "jax_compile_s", "backend"} <= set(out)
    assert (out["rows"], out["tokens"], out["repeats"]) == (2, 64, 1) and 0 < out["policy_tokens"] <= 2 * 64
    for stat in ("min", "median"):
        jax_s, numpy_s = out[f"jax_jit_s_{stat}"], out[f"numpy_s_{stat}"]
        assert jax_s > 0 and numpy_s > 0, out
        ratio = out["speedup_vs_numpy" + ("_median" if stat == "median" else "")]
        assert ratio == pytest.approx(numpy_s / jax_s, rel=0.05, abs=0.01)
    # the two arms computed the same thing (float32 jit vs float64 NumPy)
    assert out["max_abs_diff_advantages"] < 1e-4 and out["abs_diff_loss"] < 1e-4 and out["max_abs_diff_grad"] < 1e-4


def test_buffer_smallest_run_measures_all_three_arms_every_round(tmp_path):
    out = run_bench("buffer.py", "--episodes", "2", "--rounds", "1", "--dir", str(tmp_path))
    assert {"bytes", "buffer_GBps", "numpy_GBps", "queue_GBps", "buffer_vs_numpy", "buffer_vs_queue",
            "cpu_buffer_vs_numpy", "cpu_buffer_vs_queue", "per_round", "buffer", "numpy", "targets"} <= set(out)
    assert (out["episodes"], out["rounds"]) == (2, 1) and out["bytes"] > 0
    seconds, cpu = out["per_round"]["seconds"], out["per_round"]["cpu_seconds"]
    for arm in ("buffer", "numpy", "queue"):
        assert len(seconds[arm]) == 1 and seconds[arm][0] > 0 and cpu[arm][0] > 0, (arm, out["per_round"])
        assert out[f"{arm}_GBps"] > 0
    # a ratio is numpy (or queue) seconds over buffer seconds of the same round
    for other in ("numpy", "queue"):
        ratio = out[f"buffer_vs_{other}"]
        assert ratio == pytest.approx(out["per_round"][f"buffer_vs_{other}"][0], abs=1e-3)
        assert ratio == pytest.approx(seconds[other][0] / seconds["buffer"][0], rel=0.1)  # seconds shown to 1 ms
    assert out["buffer"]["commit_ms_p50"] > 0 and out["buffer"]["write_seconds"] > 0
    assert out["buffer"]["read_seconds"] > 0
    assert not os.listdir(tmp_path), "the bench left its ring buffers behind"
