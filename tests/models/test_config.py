"""Published-checkpoint config.json layouts parse, export back to configs transformers accepts, and the
explicit HF-name maps cover every parameter of the real-size models exactly (shapes only, nothing allocated)."""

import jax
import numpy as np
import pytest

from jaxwebrl.models.config import from_hf_dict, small_config, tiny_config, to_hf_dict
from jaxwebrl.models.policy import init_params_shapes

# The layout of Qwen/Qwen3-VL-8B-Instruct's config.json (rope_scaling + rope_theta, transformers 4.57 era).
QWEN3_VL_8B = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "image_token_id": 151655,
    "model_type": "qwen3_vl",
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16",
        "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 262144,
        "model_type": "qwen3_vl_text", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "use_cache": True, "vocab_size": 151936,
    },
    "tie_word_embeddings": False,
    "video_token_id": 151656,
    "vision_config": {
        "deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304,
        "model_type": "qwen3_vl", "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 4096,
        "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
    "vision_end_token_id": 151653,
    "vision_start_token_id": 151652,
}

# The layout of Qwen/Qwen2.5-VL-7B-Instruct's config.json (text fields at the top level, legacy mrope).
QWEN2_5_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 128000,
    "max_window_layers": 28, "model_type": "qwen2_5_vl", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vision_config": {
        "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
        "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2, "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 152064,
}


def _leaf_paths(tree):
    return {tuple(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize(
    "hf, billions",
    [(QWEN3_VL_8B, 8.767), (QWEN2_5_VL_7B, 8.292)],
    ids=["qwen3_vl_8b", "qwen2_5_vl_7b"],
)
def test_real_size_param_map_covers_every_parameter(hf, billions):
    config = from_hf_dict(hf, dtype="bfloat16")
    shapes = init_params_shapes(config)
    specs = config.family.param_specs(config)
    assert {s.path for s in specs} == _leaf_paths(shapes)
    assert len({s.hf_name for s in specs}) == len(specs)
    count = sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes)) / 1e9
    assert abs(count - billions) / billions < 0.005, count


def test_published_layouts_parse():
    q3 = from_hf_dict(QWEN3_VL_8B)
    assert q3.text.rope_theta == 5e6 and q3.text.mrope_section == (24, 20, 20) and q3.text.mrope_interleaved
    assert q3.vision.deepstack_visual_indexes == (8, 16, 24) and q3.vision.patch_dim == 3 * 2 * 16 * 16
    q25 = from_hf_dict(QWEN2_5_VL_7B)
    assert q25.text.head_dim == 128 and q25.text.attention_bias and not q25.text.qk_norm
    assert q25.text.mrope_section == (16, 24, 24) and not q25.text.mrope_interleaved
    assert q25.vision.in_channels == 3 and q25.vision.window_size == 112


@pytest.mark.parametrize("hf", [QWEN3_VL_8B, QWEN2_5_VL_7B], ids=["qwen3_vl_8b", "qwen2_5_vl_7b"])
def test_exported_config_is_accepted_by_transformers_and_round_trips(hf):
    from transformers import AutoConfig

    config = from_hf_dict(hf)
    exported = to_hf_dict(config)
    theirs = AutoConfig.for_model(**exported)
    assert theirs.model_type == hf["model_type"]
    assert theirs.text_config.rope_parameters["mrope_section"] == list(config.text.mrope_section)
    assert float(theirs.text_config.rope_parameters["rope_theta"]) == config.text.rope_theta
    assert theirs.text_config.num_key_value_heads == config.text.num_kv_heads
    assert from_hf_dict(exported) == config


def test_unsupported_settings_fail_clearly():
    with pytest.raises(ValueError, match="use_sliding_window"):
        from_hf_dict({**QWEN2_5_VL_7B, "use_sliding_window": True})
    with pytest.raises(ValueError, match="rope_type 'yarn'"):
        from_hf_dict({**QWEN2_5_VL_7B, "rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_presets_use_the_tiny_tokenizer_and_have_their_advertised_sizes():
    tiny, small = tiny_config(), small_config()
    assert tiny.image_token_id == small.image_token_id and tiny.text.vocab_size == small.text.vocab_size
    count = lambda c: sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(init_params_shapes(c)))
    assert count(tiny) < 300_000
    assert 45e6 < count(small) < 55e6
