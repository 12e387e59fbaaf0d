"""The model-family registry: a registered family is found by its model_type, and configs built on it reach its
hooks; an unknown model_type is refused in one line that names the supported ones."""

import dataclasses

import pytest

from jaxwebrl.models import families, presets
from jaxwebrl.models.config import from_hf_dict, tiny_config
from jaxwebrl.models.families import ModelFamily, get_family, register_family, supported_model_types


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry (built-ins loaded) that the test may add to."""
    supported_model_types()
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    return families._FAMILIES


def _fake_family(**changes) -> ModelFamily:
    """Qwen3-VL's hooks under another model_type and preset name."""
    qwen3 = get_family("qwen3_vl")
    hf = dict(qwen3.presets["qwen3vl_2b"], model_type="fake_vl")
    return dataclasses.replace(qwen3, **{"model_type": "fake_vl", "architecture": "FakeVL", "presets": {"fake_2b": hf},
                                         **changes})


def test_the_built_in_families_are_registered():
    assert supported_model_types() == ("qwen3_vl", "qwen2_5_vl")
    assert tiny_config().family is get_family("qwen3_vl")


def test_a_registered_family_is_found_and_reached_through_the_config(registry):
    fake = register_family(_fake_family(vision_mlp_matrices=5))
    assert get_family("fake_vl") is fake and "fake_vl" in supported_model_types()
    assert "fake_2b" in presets.PUBLISHED   # registered after presets was imported, listed all the same
    config = presets.preset_config("fake_2b", vision_depth=12)
    assert config.vision.deepstack_visual_indexes == (2, 5, 8)   # the family's block indexes follow the depth
    assert config.family is fake and config.family.vision_mlp_matrices == 5
    assert register_family(fake) is fake   # the same record again: a no-op


def test_another_family_under_a_taken_name_or_preset_is_refused(registry):
    with pytest.raises(ValueError, match="'qwen3_vl' is already registered"):
        register_family(dataclasses.replace(get_family("qwen3_vl"), architecture="Other"))
    with pytest.raises(ValueError, match=r"preset names \['qwen3vl_8b'\] of 'fake_vl' belong to 'qwen3_vl'"):
        register_family(_fake_family(presets={"qwen3vl_8b": get_family("qwen3_vl").presets["qwen3vl_8b"]}))
    assert "fake_vl" not in supported_model_types()


def test_an_unknown_model_type_is_refused_naming_the_supported_ones():
    for refuse in (lambda: get_family("llama"), lambda: tiny_config().replace(model_type="llama"),
                   lambda: from_hf_dict({"model_type": "llama"})):
        with pytest.raises(ValueError) as raised:
            refuse()
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith("model_type 'llama' is not supported: use one of qwen3_vl, qwen2_5_vl"), message
