"""One part of bench/device_check.sh: measure a program on the local accelerator next to its roofline prediction.

    python bench/device_check.py train  [--tiny]   # bf16 MFU of the Qwen3-VL-2B-width train step
    python bench/device_check.py decode [--tiny]   # sampler decode tokens/s at batch 64 (KV cache), old and new
                                                   # path side by side (--decode_variants, DECODE_VARIANTS; with
                                                   # continuous batching's slots: `continuous`)

Prints one JSON object, with the attention kernel the program ran (`attention_kernel`); the train step's also
counts the cuDNN fused-attention custom calls in its compiled HLO (`cudnn_attention_calls`), and
`attention_kernel_ok` is False when cudnn was selected and none is there. The programs are the project's own:
the Updater's jitted minibatch step (`train/update.py`: forward + backward of the vision-language model, the PPO
loss, AdamW) and the Sampler's prefill + chunked decode (`models/sampler.py`), on random weights at Qwen3-VL-2B's
published shapes (all 28 layers; `--tiny`: the tiny preset, for a CPU smoke test). The prediction is the analytic
roofline of `parallel/cost.py` at the chip's published bf16 peak and HBM bandwidth (`parallel/topology.py` CHIPS:
"h200" or "h100" by the GPU's device kind, else the chip named by --chip); MFU = model FLOPs / (measured step time x
peak).
Runs with only jax, flax, optax and numpy installed (ml_collections is stubbed for the import chain if absent).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def _stub_ml_collections() -> None:
    """train/update.py's import chain reaches config validation, which imports ml_collections at module level;
    the accelerator image may lack it. The check uses none of it: a stand-in module lets the import succeed."""
    try:
        import ml_collections  # noqa: F401
    except ImportError:
        stub = types.ModuleType("ml_collections")
        stub.config_dict = types.SimpleNamespace(ConfigDict=dict, placeholder=lambda kind: None)
        sys.modules["ml_collections"] = stub
        sys.modules["ml_collections.config_dict"] = stub.config_dict


def model(tiny: bool, *, dtype: str, param_dtype: str, remat: str, attention_impl: str = "auto",
          attention_chunk: int = 1024):
    from jaxwebrl.models.config import tiny_config
    from jaxwebrl.models.presets import preset_config

    if tiny:
        config = tiny_config().replace(dtype=dtype, param_dtype=param_dtype)
    else:
        config = preset_config("qwen3vl_2b", dtype=dtype, param_dtype=param_dtype)
    return config.replace(remat=remat, scan_layers=True, attention_chunk=64 if tiny else attention_chunk,
                          logits_chunk=0 if tiny else 8192, attention_impl=attention_impl)


def chip_of(name: str | None):
    """The published numbers to predict with: CHIPS[name], else those of the local GPU by its device kind (an H100
    or an H200), else None (a CPU: no roofline). Any other GPU is refused: name its numbers with --chip."""
    import jax

    from jaxwebrl.parallel.topology import CHIPS

    if name:
        return CHIPS[name]
    device = jax.devices()[0]
    if device.platform != "gpu":
        return None
    for key in ("h200", "h100"):
        if key.upper() in device.device_kind.upper():
            return CHIPS[key]
    raise SystemExit(f"device_check: no published numbers for GPU {device.device_kind!r}: pass --chip with one of "
                     f"{sorted(CHIPS)}, or add the chip to CHIPS in jaxwebrl/parallel/topology.py")


FIT_RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results", "compile",
                          "qwen3vl_2b_{chip}-1_remat_fit.jsonl")


def fit_of(chip) -> dict | None:
    """The committed AOT remat fit for `chip` at the device check's shape (`launch/compile.py --topology=<chip>-1
    --fit_remat`, docs/scaling.md), or None where there is none: its `choice` (the policy) and `rows` (an H100's
    80 GB fit 4 rows of 4,096 tokens, an H200's 141 GB 8)."""
    from jaxwebrl.parallel.topology import CHIPS

    key = next((k for k, c in CHIPS.items() if c is chip), None)
    path = FIT_RECORD.format(chip=key)
    if key is None or not os.path.exists(path):
        return None
    with open(path) as f:
        return next(r for r in map(json.loads, f) if r["program"] == "remat_fit")


def train_shape(args) -> tuple[str, int]:
    """(remat policy, rows) of the train part: `--remat`, or for "fit" the chip's fit; `--rows`, else the fit's rows
    (the old and new paths of one device check then share them), else 8."""
    chip = chip_of(args.chip)
    fit = fit_of(chip) if chip is not None else None
    if args.remat == "fit" and (fit is None or fit["choice"] is None):
        raise SystemExit(f"device_check: --remat=fit has no fitting policy for {getattr(chip, 'name', 'this device')}"
                         f": run launch/compile.py --topology=<chip>-1 --fit_remat (the command in docs/results.md) "
                         f"or name a policy")
    remat = fit["choice"] if args.remat == "fit" else args.remat
    return remat, args.rows or (fit["rows"] if fit is not None else 8)


def attention_kernel_check(kernel: str, calls: dict[str, int]) -> dict:
    """The train step's attention kernel next to the cuDNN fused-attention calls found in its compiled HLO:
    `attention_kernel_ok` is False when cudnn was selected and the program holds no forward or no backward call
    (the kernel silently not running), True otherwise."""
    ok = kernel != "cudnn" or (calls["forward"] > 0 and calls["backward"] > 0)
    if not ok:
        print(f"attention kernel check failed: cudnn selected, compiled HLO has {calls}", file=sys.stderr)
    return {"attention_kernel": kernel, "cudnn_attention_calls": calls, "attention_kernel_ok": ok}


def _timed(fn, warmup: int, iters: int):
    """Median seconds of `fn()` (which blocks until its outputs are ready) after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2], times


def screenshot_rows(config, rows: int, seq: int, tiny: bool, rng, *, images: bool = True):
    """(input_ids [rows, seq] int32 with one 1280x720 screenshot's image tokens from position 16 of every row
    (112x140 --tiny), pixel_values [rows * patches, patch_dim] float32 or None, the screenshot's grid (t, h, w))."""
    import numpy as np

    from jaxwebrl.models.presets import image_processor_for

    screenshot = (112, 140) if tiny else (720, 1280)
    grid = tuple(int(g) for g in image_processor_for(config).grid_thw(*screenshot))
    ids = rng.integers(0, 150000 if not tiny else 250, (rows, seq)).astype(np.int32)
    if not images:   # text rows only: isolates the vision tower's share
        return ids, None, grid
    ids[:, 16:16 + int(np.prod(grid)) // config.vision.spatial_merge_size ** 2] = config.image_token_id
    pixels = rng.standard_normal((rows * int(np.prod(grid)), config.vision.patch_dim)).astype(np.float32)
    return ids, pixels, grid


def train(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxwebrl.models import lm_head
    from jaxwebrl.models.attention_kernels import config_kernel, cudnn_attention_calls
    from jaxwebrl.models.policy import init_params
    from jaxwebrl.parallel import cost
    from jaxwebrl.train.update import Minibatch, OptimizerConfig, UpdateSettings, _compiled, make_optimizer

    remat, rows = train_shape(args)
    config = model(args.tiny, dtype="bfloat16" if not args.tiny else "float32", param_dtype="float32",
                   remat=remat, attention_impl=args.attention_impl, attention_chunk=args.attention_chunk)
    rows, seq = (2, 256) if args.tiny else (rows, args.seq_len)
    module, params = init_params(config, seed=0)
    optimizer_config = OptimizerConfig(lr=1e-6, total_steps=10)
    settings = UpdateSettings(loss="ppo", n_minibatches=1, n_epochs=1)
    tx, _ = make_optimizer(optimizer_config)
    opt_state = tx.init(params)
    _, step = _compiled(module, settings, optimizer_config)
    rng = np.random.default_rng(0)
    ids, pixels, grid = screenshot_rows(config, rows, seq, args.tiny, rng, images=not args.no_images)
    merged = int((ids[0] == config.image_token_id).sum())
    response = min(512, seq // 4)
    mask = np.zeros((rows, seq), np.int32)
    mask[:, -response:] = 1
    mb = Minibatch(input_ids=jnp.asarray(ids), attention_mask=jnp.ones((rows, seq), jnp.int32),
                   loss_mask=jnp.asarray(mask), behave_logprobs=jnp.full((rows, seq), -1.0, jnp.float32),
                   advantages=jnp.asarray(rng.standard_normal((rows, seq)), jnp.float32),
                   prox_logprobs=jnp.full((rows, seq), -1.0, jnp.float32),
                   loss_positions=jnp.asarray(lm_head.loss_positions(mask)))
    grids = None
    if not args.no_images:
        mb = mb._replace(pixel_values=jnp.asarray(pixels))
        grids = tuple([grid] * rows)
    t0 = time.perf_counter()
    compiled = step.lower(params, opt_state, mb, grid=grids).compile()
    compile_s = time.perf_counter() - t0
    kernel = config_kernel(config)
    kernel_check = attention_kernel_check(kernel, cudnn_attention_calls(compiled.as_text()))
    state = {"params": params, "opt": opt_state}

    def one():
        state["params"], state["opt"], stats = compiled(state["params"], state["opt"], mb)
        jax.block_until_ready(stats)

    median, times = _timed(one, args.warmup, args.iters)
    if args.trace:
        trace_one_step(one, args.trace)
    param_count = int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
    work = cost.train_step(config.replace(attention_impl=kernel), rows=rows, seq_len=seq,
                           grids_per_row=[] if args.no_images else [grid], positions=mb.loss_positions.shape[1],
                           param_count=param_count, moments_dtype=None, devices=1)
    return _report("train_step", config, work, median, times, compile_s, compiled, args,
                   {"rows": rows, "seq_len": seq, "image_tokens_per_row": merged, "params": param_count,
                    **kernel_check})


def trace_one_step(step, path: str) -> None:
    """One more call of `step` under the JAX profiler; its XPlane trace (TensorBoard's profile plugin, Perfetto
    via xprof) copied to `path`, flat, so a device run's $OUT brings it back."""
    import glob
    import shutil
    import tempfile

    import jax

    with tempfile.TemporaryDirectory() as work:
        with jax.profiler.trace(work):
            step()
        planes = glob.glob(os.path.join(work, "**", "*.xplane.pb"), recursive=True)
        if not planes:
            raise RuntimeError(f"jax.profiler.trace wrote no .xplane.pb under {work}")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        shutil.copyfile(max(planes, key=os.path.getsize), path)


# name -> (dtype of the weights decoded from, ragged read): the old and new paths side by side. The old cache
# layout ([B, S, K, D], relaid out every step) is gone from the code: "old" is its weights and its full read.
DECODE_VARIANTS = {
    "old": ("float32", False),          # the server before: the trainer's fp32 master weights, every slot read
    "new": ("bfloat16", False),         # the server now: a bf16 serving copy, every slot read in place
    "new_ragged": ("bfloat16", True),   # a bf16 serving copy, only the filled key blocks (--decode_block) read
    "continuous": ("bfloat16", False),  # new's weights and read, on continuous batching's slots (per-row steps)
}


def decode(args) -> dict:
    """Each variant of `--decode_variants` on the same fp32 master weights, one after another in this process.
    The top level is the last variant's report; `variants` holds every one's step time and its fraction of the
    bandwidth roofline of bf16 weights and a full cache (the denominator of the first H200 run)."""
    from jaxwebrl.models.policy import init_params
    from jaxwebrl.models.serving_weights import serving_copy
    from jaxwebrl.parallel import cost

    names = args.decode_variants.split(",")
    unknown = [n for n in names if n not in DECODE_VARIANTS]
    if unknown:
        raise SystemExit(f"--decode_variants: unknown {unknown}; use names from {sorted(DECODE_VARIANTS)}")
    config = model(args.tiny, dtype="bfloat16" if not args.tiny else "float32", param_dtype="float32", remat="none")
    rows = 8 if args.tiny else args.batch
    prompt = 32 if args.tiny else args.prompt_len
    new = 24 if args.tiny else args.new_tokens
    module, master = init_params(config, seed=0)
    chip = chip_of(args.chip)
    bf16_full = cost.decode_step(config.replace(param_dtype="bfloat16"), rows=rows, cache_len=prompt + new, devices=1)
    roofline_s = None if chip is None else cost.roofline(bf16_full.executed_flops, bf16_full.hbm_bytes,
                                                         chip.peak_bf16_flops, chip.hbm_bandwidth)
    reports = {}
    for name in names:
        dtype, ragged = DECODE_VARIANTS[name]
        block = (16 if args.tiny else args.decode_block) if ragged else 0
        weights = serving_copy(master, dtype)
        measure = _decode_continuous if name == "continuous" else _decode_variant
        out = measure(config.replace(param_dtype=dtype), module, weights, block, rows, prompt, new, args)
        del weights
        out.update(variant=name, weights_dtype=dtype, decode_block=block)
        if roofline_s is not None:
            out["bf16_full_cache_roofline_fraction"] = roofline_s / out["measured_step_s"]
        reports[name] = out
    result = dict(reports[names[-1]])
    result["variants"] = {name: {k: r[k] for k in ("weights_dtype", "decode_block", "measured_step_s",
                                                   "measured_tokens_per_s", "compile_s", "predicted_tokens_per_s",
                                                   "bf16_full_cache_roofline_fraction", "admit_late_rows_s")
                                 if k in r}
                          for name, r in reports.items()}
    if "old" in reports and len(reports) > 1:
        result["speedup_over_old"] = reports["old"]["measured_step_s"] / reports[names[-1]]["measured_step_s"]
    return result


def _decode_variant(config, module, params, block, rows, prompt, new, args) -> dict:
    """Prefill + chunked decode of the Sampler at one variant; seconds a decode step beside its roofline."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxwebrl.models import kv_cache
    from jaxwebrl.models.sampler import Sampler, SamplingParams, row_keys
    from jaxwebrl.parallel import cost

    chunk = 8
    sampler = Sampler(module, config, pad_token_id=0, decode_chunk=chunk, decode_block=block)
    sampling = SamplingParams(max_new_tokens=new, temperature=1.0)
    weights, _ = sampler._weights((params, 0))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 250, (rows, prompt)).astype(np.int32))
    mask = jnp.ones((rows, prompt), jnp.int32)
    static = sampling
    t0 = time.perf_counter()
    cache = kv_cache.init_cache(sampler.config, rows, prompt + new, jnp.dtype(config.dtype), decode_block=block)
    state = sampler._prefill(weights, ids, mask, None, cache, row_keys(0, rows, rows), jnp.int32(0),
                             jnp.asarray([-1], jnp.int32), None, jnp.zeros((0,), jnp.int32), jnp.int32(0),
                             grid=None, sampling=static)
    jax.block_until_ready(state)
    prefill_s = time.perf_counter() - t0
    first = jax.device_get(state.step)

    def run_chunks():
        """Decodes from a fresh copy of the prefill state (the decode chunk donates its state); returns the
        final state and the seconds the decode loop alone took."""
        s = jax.tree.map(lambda x: x.copy(), state)
        jax.block_until_ready(s)
        start = time.perf_counter()
        while int(jax.device_get(s.step)) < new:
            s = sampler._decode(weights, s, jnp.int32(0), jnp.int32(int(jax.device_get(s.step)) + chunk),
                                jnp.asarray([-1], jnp.int32), None, sampling=static)
        jax.block_until_ready(s)
        return s, time.perf_counter() - start

    final, compile_s = run_chunks()          # compiles the decode chunk and decodes once
    steps = int(jax.device_get(final.step)) - int(first)
    times = sorted(run_chunks()[1] for _ in range(args.iters))
    median = times[len(times) // 2]
    per_step = median / max(steps, 1)
    work = cost.decode_step(config, rows=rows, cache_len=prompt + new, devices=1)
    out = _report("decode", config, work, per_step, [t / max(steps, 1) for t in times], compile_s, None, args,
                  {"rows": rows, "prompt_len": prompt, "new_tokens": new, "steps_timed": steps,
                   "compile_s_includes_one_decode": True,
                   "prefill_s_incl_compile": prefill_s})
    out["measured_tokens_per_s"] = rows / per_step
    if out.get("predicted_step_s"):
        out["predicted_tokens_per_s"] = rows / out["predicted_step_s"]
    return out


def _decode_continuous(config, module, params, block, rows, prompt, new, args) -> dict:
    """`ContinuousBatcher` with `rows` slots: rows − k prompts admitted, then k more into the running slots (the
    admission timed: `admit_late_rows_s`), then decode chunks until every row has its `new` tokens; seconds a decode step."""
    import jax
    import numpy as np

    from jaxwebrl.models.continuous_batching import ContinuousBatcher
    from jaxwebrl.models.sampler import Sampler, SamplingParams
    from jaxwebrl.parallel import cost

    sampler = Sampler(module, config, pad_token_id=0, decode_chunk=8, decode_block=block)
    batcher = ContinuousBatcher(sampler, SamplingParams(max_new_tokens=new, temperature=1.0), rows,
                                capacity=prompt + new)
    weights = (sampler._weights((params, 0))[0], 0)
    ids = np.random.default_rng(0).integers(0, 250, (rows, prompt)).astype(np.int32)
    prompts, late = [{"input_ids": row} for row in ids], max(1, rows // 8)

    def generation():
        """(admission seconds of the late rows, decode seconds, decode steps) of one full generation."""
        batcher.admit(weights, prompts[late:], list(range(late, rows)), list(range(late, rows)))
        jax.block_until_ready(batcher._state)
        start = time.perf_counter()
        batcher.admit(weights, prompts[:late], list(range(late)), list(range(late)))
        jax.block_until_ready(batcher._state)
        admitted = time.perf_counter()
        while batcher.occupied:
            batcher.decode_chunk(weights)
        return admitted - start, time.perf_counter() - admitted, new - 1

    t0 = time.perf_counter()
    generation()                              # compiles both admissions and the decode chunk
    compile_s = time.perf_counter() - t0
    runs = [generation() for _ in range(args.iters)]
    per_step = sorted(decode_s / steps for _, decode_s, steps in runs)
    work = cost.decode_step(config, rows=rows, cache_len=prompt + new, devices=1)
    out = _report("decode", config, work, per_step[len(per_step) // 2], per_step, compile_s, None, args,
                  {"rows": rows, "prompt_len": prompt, "new_tokens": new, "steps_timed": new - 1,
                   "compile_s_includes_one_generation": True, "admitted_late_rows": late,
                   "admit_late_rows_s": sorted(a for a, _, _ in runs)[len(runs) // 2]})
    out["measured_tokens_per_s"] = rows / out["measured_step_s"]
    if out.get("predicted_step_s"):
        out["predicted_tokens_per_s"] = rows / out["predicted_step_s"]
    return out


def prefill(args) -> dict:
    """The sampler's prefill of --prefill_rows prompts of --seq_len tokens, one 1280x720 screenshot each, into a
    cache of seq_len + new_tokens slots, bf16 weights: old (every query over every slot of the cache, on XLA) and
    new (`fresh_cache`: the prompt over its own keys, on the model's attention kernel) side by side. The top level
    is new's report beside its roofline; `variants` holds both step times."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxwebrl.models import kv_cache
    from jaxwebrl.models.attention_kernels import config_kernel
    from jaxwebrl.models.policy import init_params
    from jaxwebrl.parallel import cost

    config = model(args.tiny, dtype="bfloat16" if not args.tiny else "float32",
                   param_dtype="bfloat16" if not args.tiny else "float32", remat="none",
                   attention_impl=args.attention_impl, attention_chunk=args.attention_chunk).replace(scan_layers=False)
    rows, seq, new = (2, 256, 24) if args.tiny else (args.prefill_rows, args.seq_len, args.new_tokens)
    module, params = init_params(config, seed=0)
    ids, pixels, grid = screenshot_rows(config, rows, seq, args.tiny, np.random.default_rng(0))
    ids, mask, pixels = jnp.asarray(ids), jnp.ones((rows, seq), jnp.int32), jnp.asarray(pixels)
    grids = np.asarray([grid] * rows)
    reports = {}
    for name, fresh in (("old", False), ("new", True)):
        step = jax.jit(lambda p, c, fresh=fresh: module.apply(
            {"params": p}, ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grids, cache=c,
            head="last", fresh_cache=fresh))
        cache = kv_cache.init_cache(config, rows, seq + new, jnp.dtype(config.dtype))
        t0 = time.perf_counter()
        compiled = step.lower(params, cache).compile()
        compile_s = time.perf_counter() - t0
        median, times = _timed(lambda: jax.block_until_ready(compiled(params, cache)), args.warmup, args.iters)
        work = cost.prefill(config.replace(attention_impl=config_kernel(config)), rows=rows, prompt_len=seq,
                            grids_per_row=[grid], devices=1)
        reports[name] = _report("prefill", config, work, median, times, compile_s, compiled, args,
                                {"rows": rows, "prompt_len": seq, "cache_len": seq + new, "variant": name,
                                 "fresh_cache": fresh})
        reports[name]["measured_prompt_tokens_per_s"] = rows * seq / median
        del compiled
    result = dict(reports["new"])
    result["variants"] = {name: {k: r[k] for k in ("measured_step_s", "measured_prompt_tokens_per_s", "compile_s",
                                                   "measured_mfu") if k in r} for name, r in reports.items()}
    result["speedup_over_old"] = reports["old"]["measured_step_s"] / reports["new"]["measured_step_s"]
    return result


def _report(name, config, work, median, times, compile_s, compiled, args, shapes) -> dict:
    import jax

    from jaxwebrl.models.attention_kernels import config_kernel
    from jaxwebrl.parallel import cost

    device = jax.devices()[0]
    out = {"program": name, "device": device.device_kind, "platform": device.platform, "jax": jax.__version__,
           **shapes, "measured_step_s": median, "step_s_all": times, "compile_s": compile_s,
           "model_flops": work.model_flops, "flops": work.executed_flops, "hbm_bytes_accessed": work.hbm_bytes,
           "knobs": {"dtype": config.dtype, "param_dtype": config.param_dtype, "remat": config.remat,
                     "scan_layers": config.scan_layers, "attention_chunk": config.attention_chunk,
                     "logits_chunk": config.logits_chunk, "attention_impl": config.attention_impl,
                     "attention_kernel": config_kernel(config)}}
    chip = chip_of(args.chip)
    if chip is not None:
        predicted = cost.roofline(work.executed_flops, work.hbm_bytes, chip.peak_bf16_flops, chip.hbm_bandwidth)
        out.update(chip=chip.name, predicted_step_s=predicted,
                   roofline_flops_utilisation=work.model_flops / (predicted * chip.peak_bf16_flops),
                   measured_mfu=work.model_flops / (median * chip.peak_bf16_flops))
    if compiled is not None:
        try:
            stats = compiled.memory_analysis()
            out["hbm_bytes_per_device"] = {"arguments": int(stats.argument_size_in_bytes),
                                           "outputs": int(stats.output_size_in_bytes),
                                           "temporaries": int(stats.temp_size_in_bytes)}
        except Exception:  # noqa: BLE001 - not every backend reports it
            pass
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("train", "decode", "prefill"))
    parser.add_argument("--tiny", action="store_true", help="the tiny preset (a CPU smoke test of the script)")
    parser.add_argument("--chip", default=None,
                        help="published numbers to predict with (default: the GPU's own, h100 or h200)")
    parser.add_argument("--rows", type=int, default=None, help="train rows (default: the chip's remat fit's, else 8)")
    parser.add_argument("--seq_len", type=int, default=4096)
    parser.add_argument("--remat", default="full", help="a named policy, or fit: the committed AOT fit's for this chip")
    parser.add_argument("--attention_chunk", type=int, default=1024, help="queries per attention chunk (0: dense)")
    parser.add_argument("--no_images", action="store_true", help="text-only rows (the vision tower's share)")
    parser.add_argument("--attention_impl", default="auto", choices=("auto", "xla", "chunked", "cudnn", "splash"),
                        help="the attention kernel (models/attention_kernels.py; auto: cuDNN on a GPU, splash on a "
                             "TPU)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prefill_rows", type=int, default=16, help="prefill: prompts in one call")
    parser.add_argument("--prompt_len", type=int, default=1024)
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--decode_variants", default="old,new_ragged,continuous,new",
                        help=f"decode paths to measure side by side, in order: {', '.join(DECODE_VARIANTS)}")
    parser.add_argument("--decode_block", type=int, default=256,
                        help="key slots a ragged decode step reads at a time (--tiny: 16)")
    parser.add_argument("--trace", default=None, help="train: write one step's profiler trace (.xplane.pb) here")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    _stub_ml_collections()
    result = {"train": train, "decode": decode, "prefill": prefill}[args.part](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
