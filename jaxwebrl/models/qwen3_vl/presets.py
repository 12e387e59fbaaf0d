"""The published Qwen3-VL shapes: config.json values of Qwen3-VL-2B-Instruct and Qwen3-VL-8B-Instruct as released."""

from __future__ import annotations

from typing import Any

from jaxwebrl.models.qwen_vocab import QWEN_VISION_TOKEN_IDS

PUBLISHED: dict[str, dict[str, Any]] = {
    "qwen3vl_2b": dict(
        model_type="qwen3_vl", tie_word_embeddings=True, **QWEN_VISION_TOKEN_IDS,
        text_config=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=262144, attention_bias=False, tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="default", mrope_section=[24, 20, 20], mrope_interleaved=True),
                         rope_theta=5000000),
        vision_config=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                           patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                           num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
                           hidden_act="gelu_pytorch_tanh"),
    ),
    "qwen3vl_8b": dict(
        model_type="qwen3_vl", tie_word_embeddings=False, **QWEN_VISION_TOKEN_IDS,
        text_config=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=262144, attention_bias=False,
                         rope_scaling=dict(rope_type="default", mrope_section=[24, 20, 20], mrope_interleaved=True),
                         rope_theta=5000000),
        vision_config=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096,
                           patch_size=16, temporal_patch_size=2, spatial_merge_size=2, in_channels=3,
                           num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                           hidden_act="gelu_pytorch_tanh"),
    ),
}
