"""launch/compile.py compiles a reduced Qwen3-VL preset for a TPU slice with XLA's TPU compiler (libtpu, no TPU) and
reports memory, FLOPs and the roofline; a program that cannot fit, an unknown topology and a missing libtpu each
end in one line that names the fix."""

import json
import os
import subprocess
import sys

import jax
import pytest

from configs import constT10, ppo
from jaxwebrl.models import presets
from jaxwebrl.parallel import distributed
from jaxwebrl.parallel.topology import libtpu_available
from jaxwebrl.train import aot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Qwen3-VL-2B widths and vocabulary cut to one decoder layer and one vision block, short rows, small screenshots:
# the real programs at a size XLA's TPU compiler handles in about a minute on two cores.
REDUCED = ["--config=configs/constT10.py:qwen3vl_2b", "--config.model.num_layers=1", "--config.model.vision_depth=1",
           "--config.buffer.max_seq_len=1024", "--config.model.max_new_tokens=64", "--config.env.prompt_window=0",
           "--config.env.screenshot_height=256", "--config.env.screenshot_width=256",
           "--config.rollout.server_max_batch=8", "--config.model.attention_chunk=256"]
needs_libtpu = pytest.mark.skipif(not libtpu_available(),
                                  reason='libtpu is not installed here: pip install -e ".[tpu]" (.ci/install does)')


def compile_cli(*args, timeout=900):
    return subprocess.run([sys.executable, os.path.join(REPO, "launch", "compile.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@needs_libtpu
def test_reduced_preset_compiles_for_v5e_8_with_a_report_per_program():
    # a KL loss term: the run also has the frozen reference's pass, its weights in bf16
    done = compile_cli(*REDUCED, "--topology=v5e-8", "--config.actor.kl_loss_coef=0.001",
                       "--config.actor.ref_dtype=bfloat16")
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["program"] for r in reports] == ["train_step", "proximal_logprobs", "reference_logprobs", "prefill",
                                               "decode", "logprob_path"]
    for r in reports:
        hbm = r["hbm_bytes_per_device"]
        assert set(hbm) == {"arguments", "outputs", "temporaries", "total"}
        assert hbm["total"] == hbm["arguments"] + hbm["outputs"] + hbm["temporaries"] - r["hbm_aliased_bytes"]
        resident = r.get("hbm_resident_bytes_per_device", {"total": 0})    # train-side programs only
        assert ("hbm_resident_bytes_per_device" in r) == (r["program"] in aot.PROGRAMS[:3])
        assert r["fits"] and hbm["total"] + resident["total"] <= r["hbm_capacity_bytes"] == 16e9
        assert r["flops"] >= r["model_flops"] > 0 and r["predicted_step_s"] > 0 and 0 < r["roofline_flops_utilisation"] <= 1
        assert r["topology"] == "v5e-8" and r["knobs"]["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
        assert r["attention_kernel"] == "splash" and r["knobs"]["attention_impl"] == "auto"   # auto on a TPU
        assert r["compile_s"] > 0
    train = reports[0]
    assert (train["rows"], train["seq_len"]) == (8, 1024)          # one row per chip
    assert train["knobs"]["scan_layers"] and train["knobs"]["remat"] == "full"
    # the parameters (fp32 master) and AdamW moments are sharded 8 ways: 2.1B params would need 34 GB whole
    assert train["hbm_bytes_per_device"]["arguments"] < 1.5e9
    assert reports[4]["predicted_tokens_per_s"] > 0 and reports[4]["bound"] == "memory"
    # the bf16 reference: held through the train step, and its pass takes half the fp32 weights' bytes
    prox, ref = reports[1], reports[2]
    held = train["hbm_resident_bytes_per_device"]["reference"]
    assert ref["ref_dtype"] == "bfloat16" and prox["hbm_resident_bytes_per_device"]["reference"] == held > 0
    saved = prox["hbm_bytes_per_device"]["arguments"] - ref["hbm_bytes_per_device"]["arguments"]
    assert saved == pytest.approx(held, rel=0.05)
    assert set(ref["hbm_resident_bytes_per_device"]) == {"policy_params", "optimizer_state", "total"}


@needs_libtpu
def test_a_program_that_cannot_fit_exits_1_naming_bytes_and_knobs():
    done = compile_cli(*REDUCED, "--topology=v5e-8", "--programs=train_step", "--rows_per_chip=512")
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["fits"]
    (line,) = [line for line in done.stderr.splitlines() if "does not fit" in line]
    assert line.startswith("train_step does not fit v5e-8: needs ")   # ("at least" when XLA refuses it)
    assert "GB per device, 16.00 GB available; knobs: --rows_per_chip (now 512), --config.buffer.max_seq_len" in line


@needs_libtpu
def test_a_train_step_whose_optimizer_state_alone_exceeds_the_chip_says_no_row_length_fits():
    # 8B, fp32 weights and moments on 8 chips of 16 GB: 8.767B params x (4 + 4 + 2 x 4) B / 8 = 17.53 GB a chip
    done = compile_cli("--config=configs/constT10.py:qwen3vl_8b", "--topology=v5e-8", "--programs=train_step",
                       "--config.buffer.max_seq_len=4096")
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["fits"] and 17.5e9 < report["state_bytes_per_device"] < 17.6e9
    (line,) = [line for line in done.stderr.splitlines() if "cannot fit" in line]
    assert line.startswith("train_step cannot fit v5e-8 at any row length: the weights, gradients and AdamW moments "
                           "alone need 17.53 GB per device (float32 weights, float32 moments), 16.00 GB available, "
                           "so at least 9 chips of this kind")


def test_unknown_topology_and_missing_libtpu_are_one_line_each():
    done = compile_cli("--config=configs/constT10.py:qwen3vl_8b", "--topology=v9z-8", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("unknown topology 'v9z-8': use one of v5e-4, v5e-8")
    # no libtpu importable and no TPU_LIBRARY_PATH: the fix is the tpu extra
    script = ("import runpy, sys; sys.modules['libtpu'] = None; "
              f"sys.argv = ['compile.py', '--config=configs/constT10.py:qwen3vl_8b', '--topology=v5p-8']; "
              "runpy.run_path('launch/compile.py', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k != "TPU_LIBRARY_PATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == \
        'libtpu is not installed: pip install -e ".[tpu]" (AOT compilation for TPU topologies)'


@needs_libtpu
def test_logprob_path_temporaries_scale_with_the_vocabulary_chunk_not_the_vocabulary(tmp_path):
    """fp32 master head weight, bf16 compute: one vocabulary chunk of the weight is cast at a time (XLA's bf16
    propagation used to turn the per-chunk cast into one cast of the whole [V, E / 8] shard before the loop).
    A TPU slice's programs stay out of the compilation cache: no local client could load them back."""
    temporaries = {}
    cache = tmp_path / "xla"
    for chunk in (128, 8192):      # 151,936 = 2^7 x 1,187: chunks of 128 and 4,748 vocabulary rows
        done = compile_cli(*REDUCED, "--topology=v5e-8", "--programs=logprob_path",
                           f"--config.model.logits_chunk={chunk}", f"--config.compilation_cache_dir={cache}")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "persistent compilation cache" not in done.stderr and not any(cache.iterdir()), done.stderr[-3000:]
        (report,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert report["knobs"]["param_dtype"] == "float32" and report["knobs"]["dtype"] == "bfloat16"
        temporaries[chunk] = report["hbm_bytes_per_device"]["temporaries"]
    shard_bf16 = 151936 * 2048 // 8 * 2     # the whole head-weight shard in bf16: 77.8 MB (what the hoisted cast took)
    assert temporaries[128] <= temporaries[8192] < shard_bf16 / 8


def _programs(config):
    """aot.Programs of `config` cut to 2 decoder layers and 2 vision blocks, fsdp over the 8 fake CPU devices
    (nothing compiled: the abstract arrays alone)."""
    config.model.num_layers, config.model.vision_depth = 2, 2
    model_config = presets.shapes_config(config.model)
    mesh = distributed.process_mesh({"data": 1, "fsdp": -1, "tensor": 1}, jax.devices("cpu")[:8])
    return aot.Programs(config, model_config, mesh, aot.RunShapes.of(config, model_config, mesh, seq_len=4096))


def test_the_train_state_held_through_each_pass_counts_against_the_chip():
    """A KL run's reference (bf16: half the fp32 weights) stays on the chip through the policy's passes unless
    offloaded; its own pass holds the policy's weights and AdamW state besides its arguments; a critic's trunk and
    AdamW state are held through the policy's passes, and the policy's through the critic's."""
    c = constT10.get_config("qwen3vl_2b")
    c.actor.kl_loss_coef, c.actor.ref_dtype = 0.001, "bfloat16"
    kl = _programs(c)
    assert aot.programs_for(c) == ("train_step", "proximal_logprobs", "reference_logprobs", "prefill", "decode",
                                   "logprob_path")
    params, opt, ref = (aot.shard_bytes(x) for x in (kl.params, kl.opt_state, kl.reference))
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(kl.reference)) and 2 * ref == params > 0
    assert kl.resident_bytes("train_step") == {"reference": ref, "total": ref}
    assert kl.resident_bytes("proximal_logprobs") == {"optimizer_state": opt, "reference": ref, "total": opt + ref}
    assert kl.resident_bytes("reference_logprobs") == {"policy_params": params, "optimizer_state": opt,
                                                       "total": params + opt}
    assert kl.resident_bytes("prefill") is None      # the policy server's programs: its own copy, not modelled
    c.actor.ref_offload = True                         # in host memory between its passes
    assert _programs(c).resident_bytes("train_step") == {"total": 0}

    critic = _programs(ppo.get_config("qwen3vl_2b"))
    assert "reference" not in critic.resident_bytes("train_step")
    trunk, trunk_opt = (aot.shard_bytes(x) for x in critic.critic_state)
    assert trunk > 0 and 2 * trunk <= trunk_opt < 2 * trunk + 1024      # fp32 AdamW moments (+ step counts)
    assert critic.resident_bytes("train_step") == {"critic_params": trunk, "critic_optimizer_state": trunk_opt,
                                                   "total": trunk + trunk_opt}
    assert critic.resident_bytes("critic_step") == {"policy_params": params, "optimizer_state": opt,
                                                    "total": params + opt}


def test_a_one_update_step_has_no_proximal_program_and_its_train_step_reads_its_own_forward():
    """ppo_n_epochs = ppo_n_minibatches = 1, no KL term: the run makes no proximal pass
    (update.prox_from_own_forward), so the report has no proximal_logprobs and the train step takes no proximal
    log-probs; a KL term brings both back."""
    c = constT10.get_config("qwen3vl_2b")
    c.train.ppo_n_epochs = c.train.ppo_n_minibatches = 1
    assert aot.programs_for(c) == ("train_step", "prefill", "decode", "logprob_path")
    one = _programs(c)
    assert one.minibatch(train=True)[0].prox_logprobs is None
    with pytest.raises(ValueError, match=r"proximal_logprobs needs more than one minibatch update a step"):
        one.proximal_logprobs()
    c.actor.kl_loss_coef = 0.001   # the reference's KL needs the proximal log-probs before any update
    assert "proximal_logprobs" in aot.programs_for(c)
    assert _programs(c).minibatch(train=True)[0].prox_logprobs is not None


@needs_libtpu
def test_a_program_the_run_does_not_execute_is_refused_in_one_line():
    done = compile_cli("--config=configs/constT10.py:qwen3vl_8b", "--topology=v5p-8",
                       "--programs=train_step,reference_logprobs", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("usage error: this config's run has no reference_logprobs "
                                                    "program: it needs a KL term: --config.actor.kl_ctl or "
                                                    "actor.kl_loss_coef > 0")


@needs_libtpu
def test_a_fit_search_whose_train_state_alone_exceeds_the_chip_compiles_no_train_step():
    # 8B, fp32 weights and moments on v5e-8: 17.53 GB a chip before any row; only the tiny logprob_path compiles
    done = compile_cli("--config=configs/constT10.py:qwen3vl_8b", "--topology=v5e-8", "--programs=logprob_path",
                       "--find_fit", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    *_, fit = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert fit["program"] == "train_step_fit" and fit["largest_fit"] is None and fit["tried"] == []
    assert 17.5e9 < fit["state_and_held_bytes_per_device"] < 17.6e9
    assert fit["reason"] == "the train state alone needs 17.53 GB per device, 16.00 GB available"


@pytest.mark.slow
def test_fit_remat_picks_the_first_policy_that_fits_and_compiles_the_train_step_once():
    """The tiny recipe on one CPU device with the H200's HBM: "none" (least recompute) fits at once; its train step
    report is the fit's own compile, not a second one. A headroom outside [0, 1) is one line, nothing compiled."""
    done = compile_cli("--config=configs/constT10.py", "--topology=h200-1", "--programs=train_step", "--fit_remat",
                       "--config.buffer.max_seq_len=256", "--config.env.prompt_window=0", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    fit, train = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert fit["program"] == "remat_fit" and fit["choice"] == "none" and fit["headroom"] == 0.1
    (tried,) = fit["tried"]
    assert tried["fits"] and tried["needed"] == train["hbm_bytes_per_device"]["total"] + \
        train["hbm_resident_bytes_per_device"]["total"] <= fit["budget_bytes"] == pytest.approx(0.9 * 141e9)
    assert train["program"] == "train_step" and train["knobs"]["remat"] == "none"
    assert train["compile_s"] == tried["compile_s"]
    done = compile_cli("--config=configs/constT10.py", "--topology=h200-1", "--programs=train_step", "--fit_remat",
                       "--remat_headroom=1.5", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("usage error: remat headroom=1.5 must be a fraction in [0, 1): "
                                                    "the share of HBM kept free")
