"""Tiny random transformers reference models (torch CPU, fp32) saved as HF directories, and input builders."""

from __future__ import annotations

import numpy as np
import torch

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 250, 251, 252, 253


def tiny_qwen3_vl(out_dir, *, tie_word_embeddings=False, seed=0):
    """A 3-layer GQA Qwen3-VL with a 3-block vision tower and DeepStack on blocks 0 and 1; saved to out_dir."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen3VLConfig(
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3], mrope_interleaved=True),
            max_position_embeddings=1024,
        ),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=4,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=64,
            num_position_embeddings=36,
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=tie_word_embeddings,
    )
    model = Qwen3VLForConditionalGeneration(config).eval()
    _perturb_norms(model)
    model.save_pretrained(str(out_dir))
    return model


def _perturb_norms(model):
    """Random init leaves norm weights at one and biases at zero; perturb them so the map is really tested."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn(param.shape, generator=gen))


def image_sequence(rng, grids, merge=2, text_between=3, lead=4, tail=5):
    """One token row: text, then per image <start> image_pad*n <end> text. Returns list[int]."""
    ids = list(rng.randint(0, 240, lead))
    for t, h, w in grids:
        ids += [VISION_START] + [IMAGE_TOKEN] * (t * h * w // merge**2) + [VISION_END]
        ids += list(rng.randint(0, 240, text_between))
    ids += list(rng.randint(0, 240, tail))
    return ids


def left_pad(rows, pad_id=0):
    """rows: list of token lists -> (ids [B, T] int64, mask [B, T] int64), left padded."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    return ids, mask


def pixels_for(rng, grids, patch_dim):
    return rng.randn(int(sum(t * h * w for t, h, w in grids)), patch_dim).astype(np.float32)


def hf_logits(model, ids, mask=None, pixels=None, grid=None, position_ids=None):
    kwargs = dict(input_ids=torch.as_tensor(ids))
    if mask is not None:
        kwargs["attention_mask"] = torch.as_tensor(mask)
    if pixels is not None:
        kwargs["pixel_values"] = torch.as_tensor(pixels)
        kwargs["image_grid_thw"] = torch.as_tensor(np.asarray(grid))
        kwargs["mm_token_type_ids"] = torch.as_tensor((np.asarray(ids) == IMAGE_TOKEN).astype(np.int64))
    if position_ids is not None:
        kwargs["position_ids"] = torch.as_tensor(np.asarray(position_ids, np.int64))
    with torch.no_grad():
        return model(**kwargs).logits.numpy()


def tiny_qwen2_5_vl(out_dir, *, seed=0):
    """A 2-layer GQA Qwen2.5-VL (qkv bias, chunked M-RoPE) with 3 vision blocks: window attention
    (2 x 2 merged tokens per window) except block 1 (full attention); saved to out_dir."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]),
            max_position_embeddings=1024,
            bos_token_id=None,
            eos_token_id=None,
        ),
        vision_config=dict(
            depth=3,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            patch_size=4,
            temporal_patch_size=2,
            spatial_merge_size=2,
            out_hidden_size=64,
            window_size=16,
            fullatt_block_indexes=[1],
        ),
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    _perturb_norms(model)
    model.save_pretrained(str(out_dir))
    return model


def encode_images(policy, pixels, grids):
    """The policy's vision tower output (jitted, grid closed over as a constant)."""
    import jax

    grid = np.asarray(grids)
    run = jax.jit(lambda params, px: policy.module.apply({"params": params}, px, grid, method="encode_images"))
    return run(policy.params, pixels)
