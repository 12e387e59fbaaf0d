"""Ahead-of-time compilation of the real programs of a run config for a device slice, and what they cost.

    shapes = RunShapes.of(config, model_config, mesh)
    for report in compile_programs(config, model_config, mesh, chip, shapes, programs=("train_step", ...)):
        print(json.dumps(report))

The programs are the ones the run executes, lowered with abstract inputs (`jax.ShapeDtypeStruct` with the
config's own shardings, nothing allocated) and compiled by XLA for the slice's devices (compile-only TPU devices
from `topology.topology_devices`, or real ones):

- `train_step`: the Updater's jitted minibatch step (forward + backward of the whole vision-language model,
  the loss, AdamW) on `rows` rows of `seq_len` tokens with the prompt window's screenshots;
- `proximal_logprobs`: the Updater's no-gradient log-prob pass on the same rows;
- `prefill`, `decode`: the policy server's Sampler at `rollout.server_max_batch` prompts that fill
  `buffer.max_seq_len` with the response budget, KV cache included (one decode program = `decode_chunk` steps);
- `logprob_path`: the LM head's log-prob + gradient alone (hidden states and head weight in, their gradients
  out) at one row per chip: the memory the trainer's log-prob path needs.

Each report: memory per device from XLA (`memory_analysis`: arguments, outputs, temporaries, total = arguments +
outputs - donated aliases + temporaries) against the chip's HBM, analytic FLOPs and HBM bytes (`cost.py`: XLA's
cost analysis counts a loop body once), the roofline step time and FLOPs utilisation (a bound, not an MFU) at the
chip's published peak, and the seconds lowering + compiling took on this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwebrl.models import kv_cache, lm_head, stacking
from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.policy import init_params_shapes
from jaxwebrl.models.presets import image_processor_for
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.models.vl_model import VisionLanguageModel
from jaxwebrl.parallel import cost, partition
from jaxwebrl.parallel.mesh import batch_divisor, batch_spec
from jaxwebrl.parallel.topology import Chip
from jaxwebrl.train import trainable
from jaxwebrl.train.rl_config import optimizer_settings, update_settings
from jaxwebrl.train.update import Minibatch, _compiled, make_optimizer

PROGRAMS = ("train_step", "proximal_logprobs", "prefill", "decode", "logprob_path")


@dataclasses.dataclass(frozen=True)
class RunShapes:
    """The shapes the programs compile at. Train rows are `rows_per_chip` per batch shard of the mesh."""

    rows: int                         # train/proximal rows (global)
    seq_len: int                      # buffer.max_seq_len
    grid: tuple[int, int, int]        # (t, h, w) patches of one screenshot
    images_per_row: int               # env.prompt_window + 1
    positions: int                    # LM-head positions per row (the loss-position bucket)
    server_rows: int                  # rollout.server_max_batch, padded like the Sampler pads it
    prompt_len: int                   # longest prompt the buffer allows: max_seq_len - max_new_tokens
    max_new_tokens: int

    @classmethod
    def of(cls, config, model_config: ModelConfig, mesh, *, rows_per_chip: int = 1,
           seq_len: int | None = None) -> "RunShapes":
        seq_len = int(seq_len or config.buffer.max_seq_len)
        grid = image_processor_for(model_config).grid_thw(config.env.screenshot_height, config.env.screenshot_width)
        images = int(config.env.prompt_window) + 1
        merged = int(np.prod(grid)) // model_config.vision.spatial_merge_size ** 2
        new = int(config.model.max_new_tokens)
        if images * merged + new >= seq_len:
            raise ValueError(f"buffer.max_seq_len={seq_len} cannot hold {images} screenshots of {merged} image tokens "
                             f"and a {new}-token response: raise it, or lower env.prompt_window / screenshot size")
        divisor = batch_divisor(mesh)
        server = int(config.rollout.server_max_batch)
        multiple = min(4, server) * divisor
        prompt = -(-(seq_len - new) // 16) * 16     # the Sampler rounds prompt widths up to 16
        positions = max(8, 1 << max(0, new - 1).bit_length())
        return cls(rows=rows_per_chip * divisor, seq_len=seq_len, grid=tuple(int(g) for g in grid),
                   images_per_row=images, positions=min(positions, seq_len), server_rows=-(-server // multiple) * multiple,
                   prompt_len=prompt, max_new_tokens=new)

    @property
    def grids_per_row(self) -> list[tuple[int, int, int]]:
        return [self.grid] * self.images_per_row

    def image_tokens_per_row(self, merge: int) -> int:
        return self.images_per_row * int(np.prod(self.grid)) // merge ** 2


def _abstract(tree, shardings):
    return jax.tree.map(lambda leaf, sh: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sh), tree, shardings)


def state_shardings(tree, mesh):
    """Shardings of a params-shaped pytree nested anywhere (optimizer state): each leaf by the partition rule its
    path ends with; scalars replicated."""
    def one(path, leaf):
        if not np.shape(leaf):
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, partition.param_spec(partition.path_string(path), np.shape(leaf), mesh))

    return jax.tree_util.tree_map_with_path(one, tree)


def _batch(mesh, shape, dtype):
    """Abstract array whose leading dimension is split over the batch axes (when it divides)."""
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, partition.fit_spec(
        batch_spec(len(shape)), shape, mesh)))


def _replicated(mesh, shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))


def memory(compiled) -> dict[str, int]:
    """Per-device bytes XLA allocates for a compiled program."""
    stats = compiled.memory_analysis()
    arguments, outputs = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
    temporaries, aliased = int(stats.temp_size_in_bytes), int(stats.alias_size_in_bytes)
    return {"arguments": arguments, "outputs": outputs, "temporaries": temporaries, "aliased": aliased,
            "total": arguments + outputs - aliased + temporaries}


def _compile(mesh, lower) -> tuple[Any, float]:
    """Lower and compile with `mesh` in context (the trainer's activation sharding hints,
    `parallel.mesh.constrain_batch`); None: no mesh in context, as the policy server runs the Sampler."""
    start = time.monotonic()
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        compiled = lower().compile()
    return compiled, time.monotonic() - start


def _xla_cost(compiled) -> dict:
    try:
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
        return {"flops": float(analysis.get("flops", 0.0)), "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}
    except Exception:  # noqa: BLE001 - a backend without cost analysis
        return {}


class Programs:
    """Abstract inputs and jitted programs of one run config on one mesh (see the module docstring)."""

    def __init__(self, config, model_config: ModelConfig, mesh, shapes: RunShapes):
        self.config, self.model_config, self.mesh, self.shapes = config, model_config, mesh, shapes
        self.module = VisionLanguageModel(model_config)
        shapes_tree = init_params_shapes(model_config)
        self.params = _abstract(shapes_tree, partition.param_shardings(shapes_tree, mesh))
        self.trainable_count, self.param_count = trainable.count(shapes_tree, model_config)
        self.optimizer_config = optimizer_settings(config)
        optimizer = trainable.masked_optimizer(make_optimizer(self.optimizer_config)[0], model_config)
        opt_shapes = jax.eval_shape(optimizer.init, shapes_tree)      # the trainable weights' moments only
        self.opt_state = _abstract(opt_shapes, state_shardings(opt_shapes, mesh))
        self.settings = update_settings(config)
        self.logprobs_fn, self.step_fn = _compiled(self.module, self.settings, self.optimizer_config)

    def state_bytes_per_device(self) -> float:
        """Weights, the trainable ones' gradients and two AdamW moments on one chip (params shard over fsdp x
        tensor): what a train step holds before any activation. Frozen weights (LoRA's base, a frozen tower) are
        held in `base_param_dtype` with no gradient or moment; LoRA's adapters, their gradients and moments are
        whole on every chip (`partition.LORA_RULES`: 43.6M parameters, 0.70 GB, for the 8B model at rank 16)."""
        c = self.model_config
        param_b, base_b = cost.dtype_bytes(c.param_dtype), cost.dtype_bytes(c.base_param_dtype)
        moment_b = cost.dtype_bytes(self.optimizer_config.moments_dtype or c.param_dtype)
        trained = self.trainable_count * 2 * (param_b + moment_b)
        shards = self.mesh.shape["fsdp"] * self.mesh.shape["tensor"]
        if c.lora is not None:
            return (self.param_count - self.trainable_count) * base_b / shards + trained
        return ((self.param_count - self.trainable_count) * base_b + trained) / shards

    # ------------------------------------------------------------------ inputs
    def minibatch(self, *, train: bool) -> tuple[Minibatch, tuple]:
        s, mesh = self.shapes, self.mesh
        rows, t = s.rows, s.seq_len
        patches = rows * s.images_per_row * int(np.prod(s.grid))
        mb = Minibatch(input_ids=_batch(mesh, (rows, t), jnp.int32), attention_mask=_batch(mesh, (rows, t), jnp.int32),
                       loss_mask=_batch(mesh, (rows, t), jnp.int32),
                       behave_logprobs=_batch(mesh, (rows, t), jnp.float32),
                       advantages=_batch(mesh, (rows, t), jnp.float32) if train else None,
                       loss_positions=_batch(mesh, (rows, s.positions), jnp.int32),
                       prox_logprobs=_batch(mesh, (rows, t), jnp.float32) if train else None,
                       ref_logprobs=(_batch(mesh, (rows, t), jnp.float32) if train and self.settings.kl_loss_coef
                                     else None),   # the KL loss term's input (train/reference.py)
                       pixel_values=_batch(mesh, (patches, self.model_config.vision.patch_dim), jnp.float32))
        grid = tuple([s.grid] * (rows * s.images_per_row))
        return mb, grid

    # ------------------------------------------------------------------ programs
    def train_step(self):
        mb, grid = self.minibatch(train=True)
        compiled, seconds = _compile(self.mesh, lambda: self.step_fn.lower(self.params, self.opt_state, mb, grid=grid))
        s = self.shapes
        work = cost.train_step(self.model_config, rows=s.rows, seq_len=s.seq_len, grids_per_row=s.grids_per_row,
                               positions=s.positions, param_count=self.trainable_count,
                               moments_dtype=self.optimizer_config.moments_dtype, devices=self.mesh.size,
                               tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.rows, "seq_len": s.seq_len, "loss_positions_per_row": s.positions}

    def proximal_logprobs(self):
        mb, grid = self.minibatch(train=False)
        compiled, seconds = _compile(self.mesh, lambda: self.logprobs_fn.lower(self.params, mb, grid=grid))
        s = self.shapes
        work = cost.forward(self.model_config, rows=s.rows, seq_len=s.seq_len, grids_per_row=s.grids_per_row,
                            positions=s.positions, devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.rows, "seq_len": s.seq_len}

    @property
    def server_config(self) -> ModelConfig:
        """The policy server's model: a LoRA run's merged weights (`policy.merged_policy`), no adapters."""
        c = self.model_config
        return c if c.lora is None else c.replace(lora=None, param_dtype=c.base_param_dtype)

    def _sampler(self):
        r = self.config.rollout
        sampler = Sampler(VisionLanguageModel(self.server_config), self.server_config, decode_chunk=int(r.decode_chunk),
                          mesh=self.mesh,
                          batch_multiple=min(4, int(r.server_max_batch)))
        sampling = SamplingParams(max_new_tokens=self.shapes.max_new_tokens, temperature=float(
            self.config.model.temperature), top_k=int(self.config.model.top_k), top_p=float(self.config.model.top_p))
        return sampler, sampling

    def _server_params(self):
        shapes_tree = jax.eval_shape(lambda p: stacking.unstack(p, self.server_config),
                                     init_params_shapes(self.server_config))
        return _abstract(shapes_tree, partition.param_shardings(shapes_tree, self.mesh))

    def _prefill_args(self, sampler, sampling):
        s, mesh = self.shapes, self.mesh
        rows, width = s.server_rows, s.prompt_len
        cache_shapes = jax.eval_shape(lambda: kv_cache.init_cache(sampler.config, rows, width + s.max_new_tokens,
                                                                  jnp.dtype(self.model_config.dtype)))
        cache = _abstract(cache_shapes, partition.cache_shardings(cache_shapes, mesh))
        patches = rows * s.images_per_row * int(np.prod(s.grid))
        args = (self._server_params(), _batch(mesh, (rows, width), jnp.int32), _batch(mesh, (rows, width), jnp.int32),
                _batch(mesh, (patches, self.model_config.vision.patch_dim), jnp.float32), cache,
                _batch(mesh, (rows, 2), jnp.uint32), _replicated(mesh, (), jnp.int32), _replicated(mesh, (1,), jnp.int32),
                None, _replicated(mesh, (0,), jnp.int32), _replicated(mesh, (), jnp.int32))
        grid = tuple([s.grid] * (rows * s.images_per_row))
        static = dataclasses.replace(sampling, stop_token_ids=(), stop_strings=())
        return args, dict(grid=grid, sampling=static)

    def _compiled_prefill(self):
        """(sampler, prefill args, static kwargs, compiled prefill, seconds), compiled once for both programs."""
        if getattr(self, "_prefill_cache", None) is None:
            sampler, sampling = self._sampler()
            args, kwargs = self._prefill_args(sampler, sampling)
            compiled, seconds = _compile(None, lambda: sampler._prefill.lower(*args, **kwargs))
            self._prefill_cache = (sampler, args, kwargs, compiled, seconds)
        return self._prefill_cache

    def prefill(self):
        _, _, _, compiled, seconds = self._compiled_prefill()
        s = self.shapes
        work = cost.prefill(self.server_config, rows=s.server_rows, prompt_len=s.prompt_len,
                            cache_len=s.prompt_len + s.max_new_tokens, grids_per_row=s.grids_per_row,
                            devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.server_rows, "prompt_len": s.prompt_len,
                                         "cache_len": s.prompt_len + s.max_new_tokens}

    def decode(self):
        sampler, args, kwargs, prefill, _ = self._compiled_prefill()
        state = jax.tree.map(lambda info, sh: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sh),
                             sampler._prefill.lower(*args, **kwargs).out_info, prefill.output_shardings)
        mesh = self.mesh
        compiled, seconds = _compile(None, lambda: sampler._decode.lower(
            args[0], state, _replicated(mesh, (), jnp.int32), _replicated(mesh, (), jnp.int32),
            _replicated(mesh, (1,), jnp.int32), None, sampling=kwargs["sampling"]))
        s = self.shapes
        work = cost.decode_step(self.server_config, rows=s.server_rows, cache_len=s.prompt_len + s.max_new_tokens,
                                devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.server_rows, "cache_len": s.prompt_len + s.max_new_tokens,
                                         "decode_chunk": int(self.config.rollout.decode_chunk),
                                         "per": "decode step (one token per row)"}

    def logprob_path(self):
        c, s, mesh = self.model_config, self.shapes, self.mesh
        rows = batch_divisor(mesh)            # one row per batch shard
        weight_shape = (c.text.vocab_size, c.text.hidden_size)
        path = "language_model/embed_tokens/embedding" if c.tie_word_embeddings else "lm_head/weight"
        weight = jax.ShapeDtypeStruct(weight_shape, jnp.dtype(c.base_param_dtype), sharding=NamedSharding(
            mesh, partition.param_spec(path, weight_shape, mesh)))
        hidden = _batch(mesh, (rows, s.seq_len, c.text.hidden_size), jnp.dtype(c.dtype))
        ids = _batch(mesh, (rows, s.seq_len), jnp.int32)
        positions = _batch(mesh, (rows, s.positions), jnp.int32)

        def loss(h, w, input_ids, pos):
            lp, _ = lm_head.token_logprobs(h, w, input_ids, compute_dtype=c.dtype,
                                           positions=pos, chunk=c.logits_chunk)
            return lp.sum()

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)),
                     out_shardings=(NamedSharding(mesh, P()), (hidden.sharding, weight.sharding)))
        compiled, seconds = _compile(self.mesh, lambda: fn.lower(hidden, weight, ids, positions))
        work = cost.logprob_path(c, rows=rows, positions=s.positions, devices=mesh.size)
        return compiled, seconds, work, {"rows": rows, "seq_len": s.seq_len, "loss_positions_per_row": s.positions}


def report(name: str, topology: str, chip: Chip, compiled, seconds: float, work: cost.Work, shapes: dict,
           knobs: dict) -> dict:
    """One program's JSON report (see the module docstring)."""
    hbm = memory(compiled)
    step_s = cost.roofline(work.executed_flops, work.hbm_bytes, chip.peak_bf16_flops, chip.hbm_bandwidth)
    out = {
        "program": name, "topology": topology, "chip": chip.name, **shapes,
        "hbm_bytes_per_device": {k: hbm[k] for k in ("arguments", "outputs", "temporaries", "total")},
        "hbm_aliased_bytes": hbm["aliased"],
        "hbm_capacity_bytes": int(chip.hbm_bytes), "fits": hbm["total"] <= chip.hbm_bytes,
        "flops": work.executed_flops, "model_flops": work.model_flops, "hbm_bytes_accessed": work.hbm_bytes,
        "predicted_step_s": step_s,
        "roofline_flops_utilisation": work.model_flops / (step_s * chip.peak_bf16_flops),  # not a measured MFU
        "bound": "compute" if work.executed_flops / chip.peak_bf16_flops >= work.hbm_bytes / chip.hbm_bandwidth
        else "memory",
        "compile_s": round(seconds, 1), "xla_cost_analysis": _xla_cost(compiled), "knobs": knobs,
    }
    if name == "decode":
        out["predicted_tokens_per_s"] = shapes["rows"] / step_s
    return out


_OUT_OF_MEMORY = re.compile(r"memory required for HLO temporaries \(([\d.]+)([KMGT])\)")


def out_of_memory_report(name: str, topology: str, chip: Chip, error: Exception, seconds: float, knobs: dict) -> dict:
    """The report of a program XLA refused to compile because its temporaries alone exceed the chip's HBM."""
    found = _OUT_OF_MEMORY.search(str(error))
    temporaries = float(found.group(1)) * 1024 ** "KMGT".index(found.group(2)) * 1024 if found else None
    return {"program": name, "topology": topology, "chip": chip.name, "fits": False,
            "hbm_bytes_per_device": {"arguments": None, "outputs": None, "temporaries": temporaries,
                                     "total": temporaries},
            "hbm_capacity_bytes": int(chip.hbm_bytes), "compile_s": round(seconds, 1), "knobs": knobs,
            "error": " ".join(str(error).split())[:400]}


def compile_programs(config, model_config: ModelConfig, mesh, chip: Chip, topology: str, shapes: RunShapes,
                     programs: Iterable[str] = PROGRAMS, knobs: dict | None = None):
    """Yields one report per program, compiling them one at a time. A program whose temporaries alone exceed the
    chip's memory (XLA refuses it: RESOURCE_EXHAUSTED) gets a `fits: false` report with the bytes XLA asked for.
    A train step's report also carries `state_bytes_per_device` (weights, gradients, AdamW moments; analytic)."""
    built = Programs(config, model_config, mesh, shapes)
    for name in programs:
        if name not in PROGRAMS:
            raise ValueError(f"unknown program {name!r}: use some of {', '.join(PROGRAMS)}")
        start = time.monotonic()
        try:
            compiled, seconds, work, program_shapes = getattr(built, name)()
        except Exception as err:  # noqa: BLE001 - only XLA's out-of-memory refusal is a result; the rest re-raise
            if "RESOURCE_EXHAUSTED" not in str(err) or "memory" not in str(err):
                raise
            out = out_of_memory_report(name, topology, chip, err, time.monotonic() - start, knobs or {})
        else:
            out = report(name, topology, chip, compiled, seconds, work, program_shapes, knobs or {})
            del compiled
        if name == "train_step":
            out["state_bytes_per_device"] = built.state_bytes_per_device()
        yield out
