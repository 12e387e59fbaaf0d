"""Frozen model configs for the Qwen-VL families, read from / written to HF `config.json`.

One `ModelConfig` describes a whole vision-language policy: `text` (decoder), `vision` (tower), the special
token ids, and the compute/param dtypes. `from_hf_dict` accepts both the current `rope_parameters` layout and
the older `rope_scaling` + `rope_theta` layout that published Qwen checkpoints use. What differs between the
families is each family's (`config.family`, `jaxwebrl.models.families`); this module holds the shared rest.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from jaxwebrl.models.families import ModelFamily, get_family
from jaxwebrl.models.lora_config import LoraConfig


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """Decoder sizes and switches. `mrope_interleaved` picks Qwen3-VL (interleaved T/H/W frequencies)
    over Qwen2.5-VL (contiguous T/H/W chunks); `qk_norm` is Qwen3's per-head RMSNorm on q and k."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    mrope_interleaved: bool = True
    qk_norm: bool = True
    attention_bias: bool = False
    max_position_embeddings: int = 128_000


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Vision tower sizes. Qwen3-VL uses `num_position_embeddings` (learned, interpolated) and
    `deepstack_visual_indexes`; Qwen2.5-VL uses `window_size` and `fullatt_block_indexes`."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    num_position_embeddings: int = 0
    deepstack_visual_indexes: tuple[int, ...] = ()
    window_size: int = 0
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened pixel_values row: C * T * P * P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A whole policy. `dtype` is the compute dtype, `param_dtype` the storage dtype of the weights
    (`param_dtype="float32", dtype="bfloat16"`: fp32 master weights, bf16 compute).

    Memory and compile-time knobs (none changes the function computed, only how): `remat` names the
    rematerialisation policy of every decoder layer and vision block (`layers.REMAT_POLICIES`, least recompute
    first: "none", "minimal", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj", "full"; True/False mean
    "full"/"none"; `train/remat_fit.py` picks the first whose train step fits a chip); `scan_layers` runs the
    decoder as one scan over stacked layer params (compile time independent of depth); `attention_chunk` > 0 computes attention that many queries at a time;
    `logits_chunk` > 0 computes the trainer's log-probs over that many vocabulary entries at a time
    (`lm_head.token_logprobs`); `attention_impl` names the attention kernel of the no-cache causal forward and
    of the vision tower ("auto": cuDNN flash attention on a GPU, splash on a TPU, XLA on the CPU; or "xla",
    "chunked", "cudnn", "splash": `attention_kernels.py`).

    Training knobs: `lora` (a `lora_config.LoraConfig`, or None) adds adapters to the decoder's named projections and
    holds every other weight in `lora.base_dtype` (`base_param_dtype`); `freeze_vision` trains no vision-tower
    weight (`train/trainable.py`: no gradient, no optimizer state).
    """

    model_type: str
    text: TextConfig
    vision: VisionConfig
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"
    scan_layers: bool = False
    attention_chunk: int = 0
    logits_chunk: int = 0
    attention_impl: str = "auto"
    lora: LoraConfig | None = None
    freeze_vision: bool = False
    hf_config_json: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self):
        if isinstance(self.remat, bool):
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        from jaxwebrl.models.layers import remat_problem

        remat_fix = remat_problem(self.remat)
        if remat_fix is not None:
            raise ValueError(f"remat={self.remat!r}: {remat_fix}")
        if self.attention_chunk < 0 or self.logits_chunk < 0:
            raise ValueError(f"attention_chunk={self.attention_chunk} and logits_chunk={self.logits_chunk} must be "
                             ">= 0 (0: no chunking)")
        from jaxwebrl.models.attention_kernels import kernel_problem  # deferred, as remat_problem: JAX

        problem = kernel_problem(self.attention_impl, dtype=self.dtype, chunk=self.attention_chunk)
        if problem is not None:
            raise ValueError(problem)
        get_family(self.model_type)   # an unknown model_type is refused, naming the supported ones
        t = self.text
        if t.num_heads % t.num_kv_heads:
            raise ValueError(f"num_heads={t.num_heads} must be a multiple of num_kv_heads={t.num_kv_heads}")
        if 2 * sum(t.mrope_section) != t.head_dim:
            raise ValueError(f"mrope_section {t.mrope_section} must sum to head_dim/2 = {t.head_dim // 2}")

    @property
    def base_param_dtype(self) -> str:
        """Storage dtype of every weight but the LoRA adapters: `lora.base_dtype` under LoRA, else param_dtype."""
        return self.lora.base_dtype if self.lora is not None else self.param_dtype

    @property
    def family(self) -> ModelFamily:
        """The hooks of this config's model family (`families.get_family(model_type)`)."""
        return get_family(self.model_type)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def _rope(sub: Mapping[str, Any], default_theta: float) -> tuple[float, dict]:
    params = dict(sub.get("rope_parameters") or {})
    scaling = dict(sub.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", sub.get("rope_theta", default_theta))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ("default", "mrope", "axial"):
        raise ValueError(f"rope_type {rope_type!r} is not supported (only default M-RoPE)")
    return float(theta), merged


def from_hf_dict(hf: Mapping[str, Any], *, dtype: str = "float32", param_dtype: str | None = None) -> ModelConfig:
    """Build a `ModelConfig` from a parsed HF `config.json` (Qwen3-VL or Qwen2.5-VL)."""
    model_type = hf.get("model_type")
    family = get_family(model_type)
    text = family.text_section(hf)
    vis = dict(hf["vision_config"])
    if text.get("use_sliding_window"):
        raise ValueError("config.json enables use_sliding_window, which jaxwebrl does not implement; set it to false")
    theta, rope = _rope(text, 1_000_000.0)
    heads = text["num_attention_heads"]
    text_cfg = TextConfig(
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        intermediate_size=text["intermediate_size"],
        num_layers=text["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads,
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        mrope_section=tuple(rope.get("mrope_section", (24, 20, 20))),
        max_position_embeddings=text.get("max_position_embeddings", 128_000),
        **family.text_fields(text),
    )
    vtheta, _ = _rope(vis, 10000.0)
    vision_cfg = VisionConfig(
        depth=vis["depth"],
        hidden_size=vis["hidden_size"],
        intermediate_size=vis["intermediate_size"],
        num_heads=vis["num_heads"],
        out_hidden_size=vis.get("out_hidden_size", text["hidden_size"]),
        in_channels=vis.get("in_channels", vis.get("in_chans", 3)),
        patch_size=vis.get("patch_size", 14),
        temporal_patch_size=vis.get("temporal_patch_size", 2),
        spatial_merge_size=vis.get("spatial_merge_size", 2),
        rope_theta=vtheta,
        tokens_per_second=vis.get("tokens_per_second", 2),
        **family.vision_fields(vis),
    )
    tie = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelConfig(
        model_type=model_type,
        text=text_cfg,
        vision=vision_cfg,
        image_token_id=hf.get("image_token_id", 151655),
        video_token_id=hf.get("video_token_id", 151656),
        vision_start_token_id=hf.get("vision_start_token_id", 151652),
        vision_end_token_id=hf.get("vision_end_token_id", 151653),
        tie_word_embeddings=bool(tie),
        dtype=dtype,
        param_dtype=param_dtype or dtype,
        hf_config_json=json.dumps(dict(hf), sort_keys=True),
    )


def to_hf_dict(config: ModelConfig) -> dict:
    """HF `config.json` content for `config` (starts from the loaded config.json when there was one)."""
    base = json.loads(config.hf_config_json) if config.hf_config_json else {}
    t, v = config.text, config.vision
    family = config.family
    rope = {
        "rope_type": "default",
        "rope_theta": t.rope_theta,
        "mrope_section": list(t.mrope_section),
    }
    if t.mrope_interleaved:
        rope["mrope_interleaved"] = True
    text = dict(base.get("text_config") or {})
    for stale in ("rope_scaling", "rope_theta"):
        text.pop(stale, None)
    text.update(
        model_type=f"{config.model_type}_text",
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_layers,
        num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_kv_heads,
        hidden_act="silu",
        rms_norm_eps=t.rms_norm_eps,
        rope_parameters=rope,
        max_position_embeddings=t.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        **family.hf_text(config),
    )
    vision = dict(base.get("vision_config") or {})
    vision.update(
        model_type=f"{config.model_type}_vision",
        depth=v.depth,
        hidden_size=v.hidden_size,
        intermediate_size=v.intermediate_size,
        num_heads=v.num_heads,
        out_hidden_size=v.out_hidden_size,
        in_channels=v.in_channels,
        patch_size=v.patch_size,
        temporal_patch_size=v.temporal_patch_size,
        spatial_merge_size=v.spatial_merge_size,
        hidden_act=v.hidden_act,
        **family.hf_vision(config),
    )
    out = family.hf_top_level({k: val for k, val in base.items() if k not in ("text_config", "vision_config")}, text)
    out.update(
        model_type=config.model_type,
        architectures=[family.architecture],
        text_config=text,
        vision_config=vision,
        image_token_id=config.image_token_id,
        video_token_id=config.video_token_id,
        vision_start_token_id=config.vision_start_token_id,
        vision_end_token_id=config.vision_end_token_id,
        tie_word_embeddings=config.tie_word_embeddings,
        dtype=config.param_dtype,
    )
    out.pop("torch_dtype", None)
    return out


def tiny_config(vocab_size: int | None = None, *, dtype: str = "float32", remat: bool | str = False,
                head_dim: int = 16) -> ModelConfig:
    """The `tiny` Qwen3-VL preset: random-init on CPU, forward+backward on [8, 256] well under a second.

    Vocabulary and vision token ids come from `jaxwebrl.models.tokenizer.tiny_tokenizer()` (vocab_size
    defaults to its size). Patch 14, merge 2, tied embeddings, DeepStack on the first vision block.
    `head_dim=32` is the `tiny_hd32` variant: vLLM's CPU attention takes head_dim 32, 64, 80, ..., not 16.
    """
    if head_dim % 16:
        raise ValueError(f"tiny head_dim={head_dim} must be a multiple of 16 (its M-RoPE sections are 2:3:3 of 8)")
    text = TextConfig(
        vocab_size=0,
        hidden_size=64,
        intermediate_size=172,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=head_dim,
        rope_theta=10000.0,
        mrope_section=tuple(n * head_dim // 16 for n in (2, 3, 3)),
        max_position_embeddings=4096,
    )
    vision = VisionConfig(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=14,
        num_position_embeddings=64,
        deepstack_visual_indexes=(0,),
    )
    return _with_tiny_tokenizer(text, vision, vocab_size, dtype=dtype, remat=remat)


def small_config(vocab_size: int | None = None, *, dtype: str = "float32", remat: bool | str = False) -> ModelConfig:
    """A ~50M-parameter Qwen3-VL preset (16 x 512-wide text layers) on the tiny tokenizer, for CPU
    throughput measurements and quick real-learning runs."""
    text = TextConfig(
        vocab_size=0,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=16,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        rope_theta=10000.0,
        mrope_section=(8, 12, 12),
        max_position_embeddings=8192,
    )
    vision = VisionConfig(
        depth=2,
        hidden_size=128,
        intermediate_size=256,
        num_heads=4,
        out_hidden_size=512,
        patch_size=14,
        num_position_embeddings=256,
        deepstack_visual_indexes=(0,),
    )
    return _with_tiny_tokenizer(text, vision, vocab_size, dtype=dtype, remat=remat)


def _with_tiny_tokenizer(text: TextConfig, vision: VisionConfig, vocab_size, *, dtype, remat) -> ModelConfig:
    """A Qwen3-VL config whose vocabulary and vision token ids are the tiny tokenizer's."""
    from jaxwebrl.models.tokenizer import VisionTokenIds, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    vocab_size = tokenizer.vocab_size if vocab_size is None else vocab_size
    if vocab_size < tokenizer.vocab_size:
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tiny tokenizer's {tokenizer.vocab_size}")
    vision_ids = VisionTokenIds.of(tokenizer)
    return ModelConfig(
        model_type="qwen3_vl",
        text=dataclasses.replace(text, vocab_size=vocab_size),
        vision=vision,
        image_token_id=vision_ids.image_pad,
        video_token_id=vision_ids.video_pad,
        vision_start_token_id=vision_ids.vision_start,
        vision_end_token_id=vision_ids.vision_end,
        tie_word_embeddings=True,
        dtype=dtype,
        param_dtype=dtype,
        remat=remat,
    )
