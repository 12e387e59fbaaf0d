"""The remat planner compiles the train step policy by policy, least recompute first, and picks the first that fits
the chip less the headroom; a real compile shows a saving policy's extra memory against "full"."""

import dataclasses

import jax
import pytest

from configs import constT10
from jaxwebrl.models import presets
from jaxwebrl.models.layers import REMAT_POLICIES
from jaxwebrl.parallel import distributed
from jaxwebrl.parallel.topology import Chip
from jaxwebrl.train import aot, remat_fit

GB = 1e9
CHIP = Chip("test chip", 1e12, 100 * GB, 1e12)


def test_pick_takes_the_least_recompute_policy_under_the_budget():
    needed = {"full": 50 * GB, "save_out_proj": 55 * GB, "save_qkv_proj": 60 * GB, "save_dot_except_mlp": 70 * GB,
              "minimal": 80 * GB, "none": 100 * GB}        # any order: REMAT_POLICIES' order decides
    assert remat_fit.budget_bytes(CHIP, 0.1) == pytest.approx(90 * GB)
    assert remat_fit.pick(needed, 90 * GB) == "minimal"
    assert remat_fit.pick(needed, 75 * GB) == "save_dot_except_mlp"
    assert remat_fit.pick(needed, 200 * GB) == "none"
    assert remat_fit.pick(needed, 49 * GB) is None
    assert remat_fit.pick({**needed, "minimal": None}, 90 * GB) == "save_dot_except_mlp"   # XLA refused it
    with pytest.raises(ValueError, match=r"remat headroom=1.0 must be a fraction in \[0, 1\)"):
        remat_fit.budget_bytes(CHIP, 1.0)


def test_fit_compiles_in_recompute_order_and_stops_at_the_first_that_fits(monkeypatch):
    """The compile is replaced by its reports (program bytes + held state) to check the order and the stop."""
    program = {"none": 120 * GB, "minimal": 95 * GB, "save_dot_except_mlp": 85 * GB, "save_qkv_proj": 80 * GB,
               "save_out_proj": 78 * GB, "full": 75 * GB}
    compiled = []

    def compile_programs(config, model_config, mesh, chip, topology, shapes, programs, knobs):
        compiled.append(model_config.remat)
        assert programs == ("train_step",) and knobs["remat"] == model_config.remat
        if model_config.remat == "none":      # XLA refuses a program whose temporaries exceed the chip
            yield {"hbm_bytes_per_device": {"temporaries": 110 * GB, "total": 110 * GB}, "error": "RESOURCE_EXHAUSTED",
                   "compile_s": 1.0}
            return
        yield {"hbm_bytes_per_device": {"temporaries": 1.0, "total": program[model_config.remat]},
               "hbm_resident_bytes_per_device": {"total": 2 * GB}, "compile_s": 1.0}

    monkeypatch.setattr(aot, "compile_programs", compile_programs)
    config = constT10.get_config()
    model_config = presets.shapes_config(config.model)
    shapes = aot.RunShapes(rows=1, seq_len=64, grid=(1, 4, 4), images_per_row=1, positions=8, server_rows=1,
                           prompt_len=48, max_new_tokens=16)
    fit, reports = remat_fit.fit(config, model_config, None, CHIP, "test", shapes, headroom=0.1)
    assert compiled == ["none", "minimal", "save_dot_except_mlp"] and set(reports) == set(compiled)
    assert fit["choice"] == "save_dot_except_mlp" and fit["budget_bytes"] == pytest.approx(90 * GB)
    assert [(t["remat"], t["needed"], t["fits"]) for t in fit["tried"]] == [
        ("none", None, False), ("minimal", 97 * GB, False), ("save_dot_except_mlp", 87 * GB, True)]
    compiled.clear()
    fit, _ = remat_fit.fit(config, model_config, None, CHIP, "test", shapes, headroom=0.3)   # budget 70 GB
    assert compiled == list(REMAT_POLICIES) and fit["choice"] is None
    with pytest.raises(ValueError, match=r"unknown remat policies \['dots'\]: use some of none, minimal"):
        remat_fit.fit(config, model_config, None, CHIP, "test", shapes, headroom=0.1, policies=("dots",))


@pytest.mark.slow
def test_a_real_compile_keeps_the_named_outputs_of_every_layer_only_under_a_saving_policy():
    """The tiny model at 8 scanned layers, 2 rows of 256 tokens, compiled for one CPU device: "minimal" keeps each
    layer's q/k/v, attention output, o_proj and gate/up outputs (600 fp32 values a token) where "full" keeps none,
    and XLA's temporaries show it."""
    config = constT10.get_config()
    config.buffer.max_seq_len, config.env.prompt_window, config.model.scan_layers = 256, 0, True
    model_config = presets.shapes_config(config.model)
    model_config = model_config.replace(text=dataclasses.replace(model_config.text, num_layers=8))
    mesh = distributed.process_mesh({"data": 1, "fsdp": -1, "tensor": 1}, jax.devices("cpu")[:1])
    shapes = aot.RunShapes.of(config, model_config, mesh, rows_per_chip=2)
    fit, reports = remat_fit.fit(config, model_config, mesh, CHIP, "cpu-1", shapes, headroom=0.1,
                                 policies=("minimal", "full"), stop_at_fit=False)
    minimal, full = fit["tried"]
    assert (minimal["remat"], full["remat"]) == ("minimal", "full") and fit["choice"] == "minimal"
    assert reports["full"]["knobs"]["remat"] == "full" and reports["full"]["program"] == "train_step"
    t = model_config.text
    # q, k, v; attention output; o_proj; gate and up
    per_token = (2 * t.num_heads + 2 * t.num_kv_heads) * t.head_dim + t.hidden_size + 2 * t.intermediate_size
    kept = per_token * 4 * shapes.rows * shapes.seq_len * t.num_layers        # 9.8 MB
    assert 0.8 * kept < minimal["temporaries"] - full["temporaries"] < 1.5 * kept, (minimal, full)
    between = (minimal["needed"] + full["needed"]) / 2
    assert remat_fit.pick({p["remat"]: p["needed"] for p in fit["tried"]}, between) == "full"
