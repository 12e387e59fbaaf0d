"""The published Qwen2.5-VL shapes: config.json values of Qwen2.5-VL-7B-Instruct as released (text fields at the
top level, the legacy `rope_scaling` layout)."""

from __future__ import annotations

from typing import Any

from jaxwebrl.models.qwen_vocab import QWEN_VISION_TOKEN_IDS

PUBLISHED: dict[str, dict[str, Any]] = {
    "qwen2_5vl_7b": dict(
        model_type="qwen2_5_vl", tie_word_embeddings=False, **QWEN_VISION_TOKEN_IDS,
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, rms_norm_eps=1e-6, max_position_embeddings=128000, rope_theta=1000000.0,
        use_sliding_window=False, rope_scaling=dict(type="mrope", mrope_section=[16, 24, 24]),
        vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                           patch_size=14, temporal_patch_size=2, spatial_merge_size=2, in_chans=3, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu"),
    ),
}
