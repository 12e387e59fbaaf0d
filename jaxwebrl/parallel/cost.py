"""Analytic FLOPs and HBM traffic per chip of the policy's programs, and the roofline step time they imply.

XLA's `cost_analysis()` counts a loop body once (scanned layers, chunked attention, the chunked LM head, the decode
loop), so the compile report counts work analytically, from the model's shapes and the knobs that change the work:

- model FLOPs (the useful work, for MFU): 2 x matmul parameters per token per pass, causal attention
  (4 * heads * head_dim per query-key pair, T(T+1)/2 pairs in a row of T), the LM head on the positions it runs
  on, the vision tower (bidirectional attention inside each image); a train step is 3 passes (forward and a
  backward of twice its cost);
- executed FLOPs (for the step time): the same plus what the implementation adds: rematerialisation (`remat`),
  the attention kernel's own work (`attention_work`: dense XLA computes the whole square of a causal row; chunked
  and the flash kernels skip the key blocks past each query block's diagonal; chunked recomputes its checkpointed
  chunks and pads an image to whole chunks; a flash kernel's backward recomputes the scores), the checkpointed
  LM-head chunks the backward recomputes, and attention over every slot of the KV cache;
- HBM bytes (an estimate): weights read once per pass by every chip (FSDP gathers each layer whole), gradients
  and optimizer state read and written once per shard, decoder activations written and read once per pass,
  the KV cache written in prefill and read once per decode step.

Every function returns per-chip `Work` for work split evenly over `devices` chips (batch over data x fsdp;
`tensor` > 1 also splits each weight read). `roofline` = max(flops / peak, bytes / bandwidth): the step time at
100% of the chip's published bf16 peak or HBM bandwidth, whichever binds; communication is not modelled, so it
is a bound on speed, not a forecast.

`config` everywhere is a `jaxwebrl.models.config.ModelConfig` whose `attention_impl` names the kernel the program
runs ("auto" is priced as the CPU's choice: resolve it for the target first, `attention_kernels.config_kernel`, as
`train/aot.py` and `bench/device_check.py` do); only its numbers are read, the family's among them
(`config.family.vision_mlp_matrices`, `.vision_window_attention`): this module imports no model code, parallel/
sits below models/ in docs/architecture.md.
"""

from __future__ import annotations

import dataclasses


# remat policy (`models/layers.py` REMAT_POLICIES) -> (the weight matmuls its backward recomputes, by checkpoint
# name group, share of the attention matmuls recomputed). Groups: "qkv" (query/key/value or the fused qkv), "out"
# (o_proj / proj), "mlpwi" (gate and up, or fc1). No policy recomputes "mlpwo" (down / fc2): a layer's backward never
# reads its own output. Attention is two matmuls (q.k^T, p.v): a policy that keeps "attention_out" recomputes only
# the scores (0.5), one that must rebuild the output projection's input recomputes both (1.0). On the XLA path;
# a fused kernel's backward recomputes the scores itself whatever the policy.
REMAT_RECOMPUTE = {
    "none": ((), 0.0),
    "minimal": ((), 0.5),
    "save_dot_except_mlp": (("mlpwi",), 0.5),
    "save_qkv_proj": (("out", "mlpwi"), 1.0),
    "save_out_proj": (("qkv", "mlpwi"), 1.0),
    "full": (("qkv", "out", "mlpwi"), 1.0),
}


# flash kernel -> the query/key tile a causal row skips by (a tile wholly past the diagonal is never computed):
# cuDNN's fused attention works in 128-token tiles; splash in `attention_kernels._block`'s 512/256/128.
FLASH_TILES = {"cudnn": (128,), "splash": (512, 256, 128)}
# a flash kernel's backward: five matmuls to the forward's two (it recomputes q.k^T and p, then dV, dP, dQ, dK)
FLASH_BACKWARD = 2.5


def dtype_bytes(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else 4


@dataclasses.dataclass(frozen=True)
class Work:
    """Per-chip work of one program run."""

    model_flops: float
    executed_flops: float
    hbm_bytes: float


def layer_matmul_groups(config) -> dict[str, int]:
    """Weight-matmul parameters of one decoder layer by checkpoint name group (see REMAT_RECOMPUTE)."""
    t = config.text
    return {"qkv": t.hidden_size * (t.num_heads + 2 * t.num_kv_heads) * t.head_dim,
            "out": t.num_heads * t.head_dim * t.hidden_size,
            "mlpwi": 2 * t.hidden_size * t.intermediate_size, "mlpwo": t.intermediate_size * t.hidden_size}


def vision_block_groups(config) -> dict[str, int]:
    """Weight-matmul parameters of one vision block by checkpoint name group (fused qkv; the family's MLP)."""
    v = config.vision
    hid, inter = v.hidden_size, v.intermediate_size
    return {"qkv": 3 * hid * hid, "out": hid * hid, "mlpwi": (config.family.vision_mlp_matrices - 1) * hid * inter,
            "mlpwo": inter * hid}


def layer_matmul_params(config) -> int:
    """Weight-matmul parameters of one decoder layer (q, k, v, o, gate, up, down)."""
    return sum(layer_matmul_groups(config).values())


def remat_recompute(config, *, tokens: int, patches: int) -> tuple[float, float, float]:
    """What `config.remat` adds to a train step's forward FLOPs: (decoder weight matmuls over `tokens`, vision-block
    weight matmuls over `patches`, share of the attention matmuls)."""
    groups, attention = REMAT_RECOMPUTE[config.remat]
    text, vision = layer_matmul_groups(config), vision_block_groups(config)
    text_flops = 2.0 * tokens * config.text.num_layers * sum(text[g] for g in groups)
    vision_flops = 2.0 * patches * config.vision.depth * sum(vision[g] for g in groups)
    return text_flops, vision_flops, attention


def causal_pairs(t: int) -> int:
    """Query-key pairs of a causal row of t tokens."""
    return t * (t + 1) // 2


def chunked_causal_pairs(t: int, chunk: int) -> int:
    """Pairs a causal row computes with queries `chunk` at a time over the keys up to each chunk's last query
    (`models/attention.py`); chunk = 0: the dense t x t."""
    if chunk <= 0 or t <= chunk:
        return t * t
    return sum((min(start + chunk, t) - start) * min(start + chunk, t) for start in range(0, t, chunk))


def priced_kernel(config) -> str:
    """The kernel the cost rows price: `config.attention_impl`, "auto" read as the CPU's choice."""
    if config.attention_impl == "auto":
        return "chunked" if config.attention_chunk > 0 else "xla"
    return config.attention_impl


def attention_work(config, lengths, *, causal: bool, trained: bool) -> tuple[float, float]:
    """(pairs executed in one forward, passes over them) of attention over rows of `lengths` tokens on the priced
    kernel. Passes: 1 for a forward only; for a trained one forward + backward (2 on XLA, FLASH_BACKWARD in a flash
    kernel) + what the remat policy recomputes (its attention share on XLA, the whole kernel once in a flash
    kernel under any recomputing policy) + what the backward runs again of chunked's checkpointed chunks."""
    kernel, chunk = priced_kernel(config), config.attention_chunk
    share = REMAT_RECOMPUTE[config.remat][1]
    if kernel in FLASH_TILES:
        tile = next((n for n in FLASH_TILES[kernel] if all(t % n == 0 for t in lengths)), FLASH_TILES[kernel][-1])
        pairs = sum(chunked_causal_pairs(t, tile) if causal else t * t for t in lengths)
        passes = 1.0 + FLASH_BACKWARD + (share > 0)
    else:
        chunked = kernel == "chunked" and chunk > 0
        if causal:
            pairs = sum(chunked_causal_pairs(t, chunk if chunked else 0) for t in lengths)
        else:   # key blocks with an online softmax: queries and keys padded to whole chunks
            pairs = sum((-(-t // chunk) * chunk if chunked and t > chunk else t) ** 2 for t in lengths)
        # the backward runs a checkpointed chunk again: a causal query chunk only its scores (p.v's output is not
        # read), an image's key blocks both matmuls (the online softmax's running sums need the outputs)
        rerun = (0.5 if causal else 1.0) if chunked and any(t > chunk for t in lengths) else 0.0
        passes = 3.0 + share + rerun
    return float(pairs), (passes if trained else 1.0)


def vision_fwd_flops(config, grids) -> tuple[float, float]:
    """(weight matmuls, attention) forward FLOPs of the vision tower on images of `grids` [(t, h, w), ...]."""
    v = config.vision
    hid = v.hidden_size
    patches = sum(t * h * w for t, h, w in grids)
    family = config.family   # the family's numbers: window attention or not (and the MLP's matrices, in the groups)
    block = 2 * sum(vision_block_groups(config).values())
    width = hid * v.spatial_merge_size ** 2
    merged = patches // v.spatial_merge_size ** 2
    mergers = 1 + len(v.deepstack_visual_indexes)
    linear = patches * (2 * v.patch_dim * hid + v.depth * block) + merged * mergers * 2 * (width * width +
                                                                                          width * v.out_hidden_size)
    if family.vision_window_attention:   # window attention except in the full-attention blocks
        window = (v.window_size // v.patch_size) ** 2
        full = len(v.fullatt_block_indexes)
        pairs = sum(t * (h * w) ** 2 for t, h, w in grids) * full
        pairs += sum(t * h * w * min(window, h * w) for t, h, w in grids) * (v.depth - full)
    else:
        pairs = sum(t * (h * w) ** 2 for t, h, w in grids) * v.depth
    return float(linear), float(4 * hid * pairs)


def weight_bytes(config, dtype: str) -> float:
    """Bytes of the decoder and head weights in `dtype` (what every chip reads per pass)."""
    t = config.text
    head = t.vocab_size * t.hidden_size
    return float((layer_matmul_params(config) * t.num_layers + head) * dtype_bytes(dtype))


def activation_bytes_per_token(config) -> float:
    """Bytes the decoder writes and reads per token per pass (residual, norms, q/k/v/o, MLP), compute dtype."""
    t = config.text
    elems = 6 * t.hidden_size + 2 * (t.num_heads + 2 * t.num_kv_heads) * t.head_dim + 4 * t.intermediate_size
    return float(elems * dtype_bytes(config.dtype) * t.num_layers)


def kv_bytes_per_token(config) -> float:
    t = config.text
    return float(2 * t.num_layers * t.num_kv_heads * t.head_dim * dtype_bytes(config.dtype))


def _forward_parts(config, rows: int, seq_len: int, grids_per_row, positions: int):
    """Forward FLOPs of rows x seq_len: (linear, attention useful, attention executed, head, vision linear,
    vision attention useful, vision attention executed), every row causal over its own tokens."""
    t = config.text
    linear = 2.0 * layer_matmul_params(config) * rows * seq_len * t.num_layers
    per_pair = 4.0 * t.num_heads * t.head_dim * t.num_layers
    useful = per_pair * rows * causal_pairs(seq_len)
    executed = per_pair * rows * attention_work(config, [seq_len], causal=True, trained=False)[0]
    head = 2.0 * t.hidden_size * t.vocab_size * rows * positions
    v_lin, v_attn = vision_fwd_flops(config, list(grids_per_row) * rows)
    return linear, useful, executed, head, v_lin, v_attn, v_attn * vision_padding(config, grids_per_row)


def vision_padding(config, grids) -> float:
    """Executed over useful attention pairs of the vision tower's images on the priced kernel (chunked pads each
    image to whole chunks; window-attention families are priced as useful)."""
    lengths = [t * h * w for t, h, w in grids]
    if not lengths or config.family.vision_window_attention:
        return 1.0
    return attention_work(config, lengths, causal=False, trained=False)[0] / sum(n * n for n in lengths)


def train_step(config, *, rows: int, seq_len: int, grids_per_row, positions: int, param_count: int,
               moments_dtype: str | None, devices: int, tensor: int = 1) -> Work:
    """Forward + backward of rows x seq_len tokens (with images), the LM head on `positions` per row, and one
    AdamW update of `param_count` (trainable) parameters sharded over the chips. A frozen decoder (LoRA) or
    tower (LoRA, freeze_vision) skips its weight-gradient matmuls (2 of the 3 passes' FLOPs remain: forward and
    the activations' gradient), and a frozen tower is not differentiated through at all (forward only);
    LoRA's own rank-r matmuls are not counted (r / width of the projections' FLOPs)."""
    lin, useful, executed, head, v_lin, v_useful, v_attn = _forward_parts(config, rows, seq_len, grids_per_row,
                                                                         positions)
    patches = rows * sum(t_ * h * w for t_, h, w in grids_per_row)
    text_re, vision_lin_re, _ = remat_recompute(config, tokens=rows * seq_len, patches=patches)
    text_passes = 2.0 if getattr(config, "lora", None) is not None else 3.0
    frozen_tower = getattr(config, "lora", None) is not None or getattr(config, "freeze_vision", False)
    vision_passes = 1.0 if frozen_tower else 3.0
    images = [t_ * h * w for t_, h, w in grids_per_row]
    _, vision_attn_passes = attention_work(config, images, causal=False, trained=not frozen_tower)
    model = text_passes * lin + 3.0 * (useful + head) + vision_passes * (v_lin + v_useful)
    flops = text_passes * lin + text_re + vision_passes * v_lin + (0.0 if frozen_tower else vision_lin_re)
    flops += attention_work(config, [seq_len], causal=True, trained=True)[1] * executed
    flops += vision_attn_passes * v_attn
    flops += (3.0 + (0 < config.logits_chunk < positions)) * head
    passes = 3.0 + bool(REMAT_RECOMPUTE[config.remat][0])     # a recomputing policy reads the weights again
    param_b, moment_b = dtype_bytes(config.param_dtype), dtype_bytes(moments_dtype or config.param_dtype)
    weights = passes * weight_bytes(config, config.dtype) / tensor
    optimizer = param_count * (4 * param_b + 4 * moment_b) / devices      # grads w+r, params r+w, m and v r+w
    activations = passes * activation_bytes_per_token(config) * rows * seq_len / devices
    return Work(model / devices, flops / devices, weights + optimizer + activations)


def forward(config, *, rows: int, seq_len: int, grids_per_row, positions: int, devices: int,
            tensor: int = 1) -> Work:
    """One forward pass (the proximal log-probs): rows x seq_len tokens, the LM head on `positions` per row."""
    lin, useful, executed, head, v_lin, v_useful, v_attn = _forward_parts(config, rows, seq_len, grids_per_row,
                                                                         positions)
    model = lin + useful + head + v_lin + v_useful
    flops = lin + executed + head + v_lin + v_attn
    hbm = weight_bytes(config, config.dtype) / tensor + activation_bytes_per_token(config) * rows * seq_len / devices
    return Work(model / devices, flops / devices, hbm)


def prefill(config, *, rows: int, prompt_len: int, grids_per_row, devices: int, tensor: int = 1) -> Work:
    """The sampler's prefill: rows prompts of prompt_len tokens into an empty cache, head on the last;
    the prompt attends its own keys causally on the attention kernel (`decoder.TextDecoder`'s `fresh_cache`)."""
    lin, useful, executed, head, v_lin, v_useful, v_attn = _forward_parts(config, rows, prompt_len, grids_per_row, 1)
    model = lin + useful + head + v_lin + v_useful
    flops = lin + executed + head + v_lin + v_attn
    hbm = weight_bytes(config, config.param_dtype) / tensor
    hbm += (activation_bytes_per_token(config) + kv_bytes_per_token(config)) * rows * prompt_len / devices
    return Work(model / devices, flops / devices, hbm)


def decode_step(config, *, rows: int, cache_len: int, devices: int, tensor: int = 1) -> Work:
    """One decode step of `rows` rows over a cache of cache_len slots (every slot is scanned, masked or not)."""
    t = config.text
    lin = 2.0 * layer_matmul_params(config) * rows * t.num_layers
    attn = 4.0 * t.num_heads * t.head_dim * t.num_layers * rows * cache_len
    head = 2.0 * t.hidden_size * t.vocab_size * rows
    hbm = weight_bytes(config, config.param_dtype) / tensor + kv_bytes_per_token(config) * rows * cache_len / devices
    return Work((lin + attn + head) / devices, (lin + attn + head) / devices, hbm)


def logprob_path(config, *, rows: int, positions: int, devices: int) -> Work:
    """The LM head's log-prob + gradient on `positions` per row (forward, recomputed chunks, 2 x backward)."""
    head = 2.0 * config.text.hidden_size * config.text.vocab_size * rows * positions
    chunked = 0 < config.logits_chunk < positions
    hbm = 3.0 * config.text.hidden_size * config.text.vocab_size * dtype_bytes(config.param_dtype)
    return Work(3.0 * head / devices, (3.0 + chunked) * head / devices, hbm)


def roofline(flops: float, hbm_bytes: float, peak_flops: float, bandwidth: float) -> float:
    """Seconds at 100% of peak compute or HBM bandwidth, whichever binds."""
    return max(flops / peak_flops, hbm_bytes / bandwidth)
