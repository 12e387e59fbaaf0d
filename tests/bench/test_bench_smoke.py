"""Every bench script that runs on the CPU (the in-process ones; tests/bench/test_bench_smoke_live.py has those with
browsers, workers and servers) runs for real at its smallest size: the JSON it prints has its keys, both arms of every
ratio were measured, and each ratio is the one of its arms."""

import os

import pytest


def test_rl_core_smallest_run_measures_both_arms_and_agrees_with_numpy(run_bench):
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


def test_buffer_smallest_run_measures_all_three_arms_every_round(run_bench, tmp_path):
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
        assert ratio == pytest.approx(seconds[other][0] / seconds["buffer"][0], rel=1e-3, abs=1e-3)
    assert out["buffer"]["commit_ms_p50"] > 0 and out["buffer"]["write_seconds"] > 0
    assert out["buffer"]["read_seconds"] > 0
    assert not os.listdir(tmp_path), "the bench left its ring buffers behind"


def test_model_smallest_run_measures_decode_train_step_and_load_memory(run_bench):
    out = run_bench("model.py", "--prompt", "16", "--new-tokens", "4", "--train-batch", "1", "--train-len", "16",
                    "--repeats", "1")
    decode, train, load = out["decode"], out["train_step"], out["load_memory"]
    assert (decode["prompt_tokens"], decode["new_tokens"], decode["recompute_steps_timed"]) == (16, 4, 4)
    assert decode["kv_cache_s"] > 0 and decode["full_recompute_s"] > 0
    assert decode["speedup"] == pytest.approx(decode["full_recompute_s"] / decode["kv_cache_s"])
    assert decode["same_tokens"], "the cached and the recomputed greedy tokens differ"
    assert train["tokens_per_step"] == 16 and train["step_s"] > 0 and train["matmul_tflops"] > 0
    assert train["utilisation"] == pytest.approx(train["model_tflops"] / train["matmul_tflops"])
    assert 40e6 < train["text_params"] < 60e6, train   # the ~50M preset the figure quotes
    assert load["checkpoint_bytes"] > 4 * 40e6 and load["peak_over_size"] > 0 and load["cold_peak_over_size"] > 0


def test_constrained_decode_smallest_run_times_both_ways_of_the_forced_prefix(run_bench):
    out = run_bench("constrained_decode.py", "--batch", "1", "--repeats", "1")
    assert out["batch"] == 1 and out["grammar"] == "toy" and out["forced_prefix_tokens"] > 0
    decoded, prefilled = out["decoded"], out["prefilled"]
    assert decoded["batch_s_median"] > 0 and prefilled["batch_s_median"] > 0
    assert decoded["response_tokens"] == prefilled["response_tokens"] > out["forced_prefix_tokens"]
    assert out["speedup"] == pytest.approx(decoded["batch_s_median"] / prefilled["batch_s_median"], abs=0.01)


def test_continuous_batching_smallest_run_serves_one_trace_both_ways(run_bench):
    out = run_bench("continuous_batching.py", "--requests", "6", "--slots", "4", "--new_tokens", "8",
                    "--mean_tokens", "4", "--min_prompt", "9", "--max_prompt", "16")
    assert (out["requests"], out["slots"], out["max_new_tokens"]) == (6, 4, 8)
    assert out["same_tokens"] and not out["compiled_while_timed"]   # each row as alone; warm-up compiled all
    assert 1 <= out["response_tokens"]["min"] <= out["response_tokens"]["max"] <= 8
    static, continuous = out["static"], out["continuous"]
    for arm in (static, continuous):
        assert 0 < arm["latency_p50_s"] <= arm["latency_p95_s"] and arm["tokens_per_s"] > 0
    assert out["latency_p50_static_over_continuous"] == pytest.approx(
        static["latency_p50_s"] / continuous["latency_p50_s"], rel=1e-3)
    assert out["tokens_per_s_continuous_over_static"] == pytest.approx(
        continuous["tokens_per_s"] / static["tokens_per_s"], rel=1e-3)


def test_update_ab_smallest_run_times_an_update_of_the_fixed_batch(run_bench, tmp_path):
    batch = tmp_path / "batch.npz"
    # one update: one length group, the quickest compile (house/length_groups_update_ab.json)
    out = run_bench("update_ab.py", "--updates", "1", "--batch", str(batch), "--length_groups", "1")
    assert batch.is_file(), "the fixed batch was not cached for the next tree"
    assert out["length_groups"] == 1 and out["rows"] > 0 and out["shape"][0] >= out["rows"] and len(out["seconds"]) == 1
    assert out["seconds"][0] > 0 and out["last_update"]["grad_norm"] > 0


@pytest.mark.parametrize("part, extra", [("train", ("--rows", "1", "--seq_len", "64")),
                                         ("decode", ("--batch", "2", "--prompt_len", "16", "--new_tokens", "8")),
                                         ("prefill", ())])
def test_device_check_tiny_measures_the_program_beside_its_roofline(run_bench, part, extra, tmp_path):
    trace = tmp_path / "train_step.xplane.pb"     # the train part also writes one step's profiler trace
    extra = (*extra, "--trace", str(trace)) if part == "train" else extra
    out = run_bench("device_check.py", part, "--tiny", "--chip", "h200", "--iters", "1", *extra)
    assert out["platform"] == "cpu" and out["measured_step_s"] > 0 and out["model_flops"] > 0
    assert out["chip"] == "NVIDIA H200 SXM" and out["predicted_step_s"] > 0
    peak = 989e12
    assert out["measured_mfu"] == pytest.approx(out["model_flops"] / (out["measured_step_s"] * peak))
    assert out["roofline_flops_utilisation"] == pytest.approx(out["model_flops"] / (out["predicted_step_s"] * peak))
    assert out["knobs"]["attention_kernel"] == "chunked"      # the tiny preset's attention_chunk on the CPU
    if part == "train":   # the compiled step's HLO was read: no cuDNN call on the CPU, none expected
        assert out["cudnn_attention_calls"] == {"forward": 0, "backward": 0} and out["attention_kernel_ok"]
        assert trace.is_file() and trace.stat().st_size > 1000
    if part == "decode":   # the old and new decode paths side by side, the new one reported at the top level
        variants = out["variants"]
        assert list(variants) == ["old", "new_ragged", "continuous", "new"] and out["variant"] == "new"
        assert variants["continuous"]["measured_step_s"] > 0 and variants["continuous"]["admit_late_rows_s"] > 0
        assert variants["old"]["weights_dtype"] == "float32" and variants["new"]["weights_dtype"] == "bfloat16"
        assert variants["new_ragged"]["decode_block"] > 0 == variants["new"]["decode_block"]
        assert out["speedup_over_old"] == pytest.approx(variants["old"]["measured_step_s"] / out["measured_step_s"])
    if part == "prefill":   # the whole-cache XLA prefill and the kernel's own-keys prefill side by side
        assert list(out["variants"]) == ["old", "new"] and out["fresh_cache"] and out["variant"] == "new"
        assert out["cache_len"] > out["prompt_len"] and out["measured_prompt_tokens_per_s"] > 0
        assert out["speedup_over_old"] == pytest.approx(out["variants"]["old"]["measured_step_s"]
                                                        / out["measured_step_s"])


def test_attention_check_tiny_times_each_kernel_beside_the_xla_reference(run_bench):
    out = run_bench("attention_check.py", "--tiny", "--iters", "1")
    assert out["backend"] == "cpu" and set(out["shapes"]) == {"text", "vision"}
    for shape in out["shapes"].values():
        kernels = shape["kernels"]
        for name in ("xla", "chunked"):   # both run on the CPU and agree with the fp32 reference
            assert kernels[name]["ms"] > 0 and kernels[name]["max_abs_diff_out"] < 1e-5, (name, kernels[name])
            assert kernels[name]["max_abs_diff_dq"] < 1e-5
            # the bench rounds the ratio of its rounded times to 3 decimals: 0.032 for 0.03163 (a CPU run under load)
            assert kernels[name]["speedup_over_xla"] == pytest.approx(kernels["xla"]["ms"] / kernels[name]["ms"],
                                                                      abs=6e-4)
        assert "needs a TPU" in kernels["splash"]["skipped"]      # reported with its reason, not timed
        assert "cudnn" in kernels["cudnn"]["skipped"]


