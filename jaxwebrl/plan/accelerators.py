"""Accelerator timings for the fleet model at paper scale, from the reports in docs/results (never typed in):

- `v5p-8` and other TPU slices: the AOT roofline (`docs/results/compile/<preset>_<topology>.jsonl`, launch/compile.py):
  train_step and proximal_logprobs seconds per row-token, prefill seconds per prompt token, and the decode step
  split into the weights' bytes and each row's cache bytes (HBM-bound, as the report says);
- `h200x8` (the 8B recipe on 8 GPUs): the H200 device check (`GPU_CHECKS`, bench/device_check.sh, Qwen3-VL-2B
  widths): its fastest train step with screenshots a token, scaled to the 8B preset by model FLOPs a token (from
  the AOT report) at the measured MFU, over 8 GPUs with ideal data parallelism; decode at the server's default
  variant (`SERVER_DECODE_VARIANT`) scaled by the parameter count (memory-bound); prefill scaled by model FLOPs a
  prompt token where the check measured it, else a quarter of the train step's time a token (full remat: two
  forwards and a backward of two); proximal = the AOT report's proximal / train ratio. Both layouts of the check
  are read: today's parts (`train_new`, `train_old`, ..., `decode` with its `variants`, `prefill`) and the 30 Nov
  run's (`train_step`, `train_step_xla`, `decode`).

    timing = AcceleratorTiming.from_results("docs/results", "v5p-8")
    timing.update_s(rows=1200, row_tokens=3385, epochs=3)      # one update of the trainer
    timing.batch_s(requests=64, prompt_tokens=3129, response_tokens=256, row_tokens=3385)   # one server batch
"""

from __future__ import annotations

import dataclasses
import json
import os

from jaxwebrl.parallel.topology import CHIPS, TOPOLOGIES
from jaxwebrl.plan.calibration import load_json

GPU_TOPOLOGIES = {"h200x8": ("h200", 8)}
GPU_CHECKS = {"h200": "device/device_check_h200.json"}   # the device check each GPU's timings come from
# the device check's train parts with screenshots (bench/device_check.sh; then the 30 Nov run's names): the fleet
# model takes the fastest a token, as the recipe would run the faster path
TRAIN_PARTS = ("train_new", "train_old", "train_new_full_remat", "train_step", "train_step_xla")
SERVER_DECODE_VARIANT = "new"   # the policy server's default decode: the bf16 serving copy, every slot read
STATE_BYTES_PER_PARAM = 16      # fp32 master weights, gradients and two AdamW moments (docs/scaling.md)


def _programs(path: str) -> dict[str, dict]:
    with open(path, encoding="utf-8") as f:
        return {record["program"]: record for record in (json.loads(line) for line in f if line.strip())}


@dataclasses.dataclass(frozen=True)
class AcceleratorTiming:
    """Seconds of the trainer (all its chips) and of the policy server (one chip) for the fleet model."""

    topology: str
    chips: int
    train_s_per_token: float        # one epoch's forward + backward, a row-token, the whole trainer
    proximal_s_per_token: float
    prefill_s_per_token: float      # the server, a prompt token
    decode_weights_s: float         # the server, one decode step: reading the weights
    decode_s_per_cache_token: float  # ... and each cached token of each row
    publish_s: float                # weights to the server after an update (an all-gather; bytes / HBM bandwidth)
    params: float
    sources: dict

    def update_s(self, *, rows: int, row_tokens: float, epochs: int) -> float:
        return rows * row_tokens * (self.proximal_s_per_token + epochs * self.train_s_per_token)

    def batch_s(self, *, requests: int, prompt_tokens: float, response_tokens: float, row_tokens: float) -> float:
        decode_step = self.decode_weights_s + requests * row_tokens * self.decode_s_per_cache_token
        return requests * prompt_tokens * self.prefill_s_per_token + response_tokens * decode_step

    @classmethod
    def from_results(cls, results_dir: str, topology: str, *, preset: str = "qwen3vl_8b") -> "AcceleratorTiming":
        if topology in GPU_TOPOLOGIES:
            return cls._gpu(results_dir, topology, preset)
        path = os.path.join(results_dir, "compile", f"{preset}_{topology}.jsonl")
        if topology not in TOPOLOGIES or not os.path.exists(path) or not os.path.getsize(path):
            known = sorted([*GPU_TOPOLOGIES, *(t for t in TOPOLOGIES if _has_report(results_dir, preset, t))])
            raise ValueError(f"topology={topology!r}: no AOT report {path} for it; use one of {known} or run "
                             f"launch/compile.py --topology={topology} --out={path}")
        p = _programs(path)
        train, proximal, prefill, decode = p["train_step"], p["proximal_logprobs"], p["prefill"], p["decode"]
        chip = CHIPS[TOPOLOGIES[topology].chip]
        chips = TOPOLOGIES[topology].num_chips
        params = train["state_bytes_per_device"] * chips / STATE_BYTES_PER_PARAM
        weight_bytes = params * 4   # the server decodes from the fp32 master copy (docs/scaling.md)
        cache_bytes_per_token = (decode["hbm_bytes_accessed"] - weight_bytes) / (decode["rows"] * decode["cache_len"])
        return cls(
            topology=topology, chips=chips,
            train_s_per_token=train["predicted_step_s"] / (train["rows"] * train["seq_len"]),
            proximal_s_per_token=proximal["predicted_step_s"] / (proximal["rows"] * proximal["seq_len"]),
            prefill_s_per_token=prefill["predicted_step_s"] / (prefill["rows"] * prefill["prompt_len"]),
            decode_weights_s=weight_bytes / chip.hbm_bandwidth,
            decode_s_per_cache_token=cache_bytes_per_token / chip.hbm_bandwidth,
            publish_s=params * 2 / chip.hbm_bandwidth, params=params,
            sources={"report": os.path.relpath(path, results_dir), "kind": "AOT roofline (predicted_step_s), not measured",
                     "params": "train_step state_bytes_per_device x chips / 16 bytes a parameter",
                     "decode": "report's HBM bytes a step = fp32 weights + rows x cache_len x bytes a cached token"})

    @classmethod
    def _gpu(cls, results_dir: str, topology: str, preset: str) -> "AcceleratorTiming":
        chip_key, gpus = GPU_TOPOLOGIES[topology]
        chip = CHIPS[chip_key]
        device = load_json(os.path.join(results_dir, GPU_CHECKS[chip_key]))
        measured = [device[k] for k in TRAIN_PARTS if "measured_step_s" in device.get(k, {})]
        if not measured:
            raise ValueError(f"{GPU_CHECKS[chip_key]} has no measured train step (parts {TRAIN_PARTS}): rerun "
                             f"bench/device_check.sh on the {chip.name}")
        step = min(measured, key=lambda r: r["measured_step_s"] / (r["rows"] * r["seq_len"]))
        aot = _programs(os.path.join(results_dir, "compile", f"{preset}_v5p-8.jsonl"))
        flops_8b = aot["train_step"]["model_flops"] / aot["train_step"]["seq_len"]   # one row a chip
        flops_measured = step["model_flops"] / (step["rows"] * step["seq_len"])
        one_gpu = step["measured_step_s"] / (step["rows"] * step["seq_len"]) * flops_8b / flops_measured
        params = aot["train_step"]["state_bytes_per_device"] * TOPOLOGIES["v5p-8"].num_chips / STATE_BYTES_PER_PARAM
        prox_ratio = (aot["proximal_logprobs"]["predicted_step_s"] / aot["train_step"]["predicted_step_s"])
        decode = device["decode"]
        decode_s = decode.get("variants", {}).get(SERVER_DECODE_VARIANT, decode)["measured_step_s"]
        prefill_s, prefill_source = one_gpu / 4, "a quarter of one GPU's train time a token (not measured)"
        if "measured_step_s" in device.get("prefill", {}):
            prefill, aot_prefill = device["prefill"], aot["prefill"]
            prompt_tokens = prefill["rows"] * prefill["prompt_len"]
            scale = (aot_prefill["model_flops"] / (aot_prefill["rows"] * aot_prefill["prompt_len"])
                     / (prefill["model_flops"] / prompt_tokens))
            prefill_s = prefill["measured_step_s"] / prompt_tokens * scale
            prefill_source = (f"{prefill['measured_step_s']:.3f} s for {prefill['rows']} x {prefill['prompt_len']} "
                              f"prompt tokens, x {scale:.2f} (model FLOPs a prompt token, 8B / measured)")
        return cls(
            topology=topology, chips=gpus, train_s_per_token=one_gpu / gpus,
            proximal_s_per_token=one_gpu / gpus * prox_ratio, prefill_s_per_token=prefill_s,
            decode_weights_s=decode_s * params / step["params"], decode_s_per_cache_token=0.0,
            publish_s=params * 2 / chip.hbm_bandwidth, params=params,
            sources={"report": f"{GPU_CHECKS[chip_key]} (measured, 2B widths) scaled to 8B",
                     "train": f"{step['measured_step_s']:.2f} s for {step['rows']} x {step['seq_len']} tokens, x "
                              f"{flops_8b / flops_measured:.2f} (model FLOPs a token, 8B / measured), / {gpus} GPUs "
                              f"(ideal data parallelism)",
                     "proximal": f"train x {prox_ratio:.3f} (the AOT report's proximal / train)",
                     "prefill": prefill_source,
                     "decode": f"{decode_s * 1e3:.2f} ms a step at batch {decode['rows']} x "
                               f"{params / step['params']:.2f} (parameters, memory-bound)"})

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _has_report(results_dir: str, preset: str, topology: str) -> bool:
    path = os.path.join(results_dir, "compile", f"{preset}_{topology}.jsonl")
    return os.path.exists(path) and os.path.getsize(path) > 0
