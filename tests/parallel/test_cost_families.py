"""The cost model's vision tower counts read the family's numbers from the config (SwiGLU's third MLP matrix,
Qwen2.5-VL's window attention): the FLOPs are those the per-family branches counted before the families moved
into `models/families.py` (values from that code)."""

import dataclasses

import pytest

from jaxwebrl.models.presets import preset_config
from jaxwebrl.parallel.cost import vision_fwd_flops

GRIDS = [(1, 36, 64), (1, 20, 28)]


@pytest.mark.parametrize("preset, flops", [("qwen3vl_2b", (1882957283328.0, 552666660864.0)),
                                           ("qwen2_5vl_7b", (3680876953600.0, 141416202240.0))])
def test_vision_flops_per_family_are_unchanged(preset, flops):
    assert vision_fwd_flops(preset_config(preset), GRIDS) == flops


def test_window_attention_and_mlp_width_come_from_the_family(monkeypatch):
    config = preset_config("qwen2_5vl_7b")
    dense = dataclasses.replace(config.family, vision_mlp_matrices=2, vision_window_attention=False)
    monkeypatch.setattr(type(config), "family", property(lambda self: dense))
    linear, attention = vision_fwd_flops(config, GRIDS)
    assert linear < 3680876953600.0 and attention > 141416202240.0
