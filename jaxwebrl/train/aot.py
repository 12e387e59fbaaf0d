"""Ahead-of-time compilation of the real programs of a run config for a device slice, and what they cost.

    shapes = RunShapes.of(config, model_config, mesh)
    for report in compile_programs(config, model_config, mesh, chip, shapes, programs=("train_step", ...)):
        print(json.dumps(report))

The programs are the ones the run executes, lowered with abstract inputs (`jax.ShapeDtypeStruct` with the
config's own shardings, nothing allocated) and compiled by XLA for the slice's devices (compile-only TPU devices
from `topology.topology_devices`, or real ones):

- `train_step`: the Updater's jitted minibatch step (forward + backward of the whole vision-language model,
  the loss, AdamW) on `rows` rows of `seq_len` tokens with the prompt window's screenshots;
- `proximal_logprobs`: the Updater's no-gradient log-prob pass on the same rows (a step of more than one
  minibatch update, or a KL run: `update.prox_from_own_forward`);
- `reference_logprobs` (a KL run: `actor.kl_ctl` or `actor.kl_loss_coef` > 0): the same pass on the frozen
  reference's weights, held in `actor.ref_dtype` (`train/reference.py`);
- `critic_values`, `critic_step` (`critic.enabled`): the value model's no-gradient values and its clipped
  value-loss AdamW step on the same rows (`train/critic.py`: a second trunk with its own AdamW state);
- `prefill`, `decode`: the policy server's Sampler at `rollout.server_max_batch` prompts that fill
  `buffer.max_seq_len` with the response budget, KV cache included (one decode program = `decode_chunk` steps);
- `logprob_path`: the LM head's log-prob + gradient alone (hidden states and head weight in, their gradients
  out) at one row per chip: the memory the trainer's log-prob path needs.

Each report: memory per device from XLA (`memory_analysis`: arguments, outputs, temporaries, total = arguments +
outputs - donated aliases + temporaries) against the chip's HBM, analytic FLOPs and HBM bytes (`cost.py`: XLA's
cost analysis counts a loop body once), the roofline step time and FLOPs utilisation (a bound, not an MFU) at the
chip's published peak, and the seconds lowering + compiling took on this machine. The train-side programs' reports
also carry `hbm_resident_bytes_per_device`: what the Updater keeps on the chip through that pass besides the
program's own arguments (the policy's weights and AdamW state, the reference unless `actor.ref_offload`, the
critic's state), from the abstract arrays' shard shapes; their `fits` counts it. Every report names the
`attention_kernel` its programs were compiled with (`model.attention_impl` resolved for the slice's platform).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
import types
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwebrl.models import kv_cache, lm_head, stacking, value_head
from jaxwebrl.models.attention_kernels import config_kernel
from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.policy import init_params_shapes
from jaxwebrl.models.presets import image_processor_for
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.models.serving_weights import serving_dtype
from jaxwebrl.models.vl_model import VisionLanguageModel
from jaxwebrl.parallel import cost, partition
from jaxwebrl.parallel.mesh import batch_divisor, batch_spec
from jaxwebrl.parallel.topology import Chip
from jaxwebrl.train import reference, trainable
from jaxwebrl.train.critic import CriticState
from jaxwebrl.train.rl_config import optimizer_settings, update_settings, value_model
from jaxwebrl.train.update import Minibatch, _compiled, make_optimizer, prox_from_own_forward

PROGRAMS = ("train_step", "proximal_logprobs", "reference_logprobs", "critic_values", "critic_step", "prefill",
            "decode", "logprob_path")
# Programs only some runs have: name -> (whether `config` runs it, what makes it run).
_WITH_CRITIC = (lambda c: bool(c.critic.enabled), "a critic: --config.critic.enabled=True (ppo.py)")
_SEPARATE_PROX = (lambda c: not prox_from_own_forward(c.train.ppo_n_epochs, c.train.ppo_n_minibatches,
                                                      reference.needed(c)),
                  "more than one minibatch update a step (--config.train.ppo_n_epochs x ppo_n_minibatches > 1) "
                  "or a KL term: a step of one update reads its proximal log-probs off that update's forward")
OPTIONAL = {"proximal_logprobs": _SEPARATE_PROX,
            "reference_logprobs": (reference.needed, "a KL term: --config.actor.kl_ctl or actor.kl_loss_coef > 0"),
            "critic_values": _WITH_CRITIC, "critic_step": _WITH_CRITIC}
# What each train-side program takes as arguments of the train state the Updater holds (see `resident_bytes`).
_ARGUMENTS = {"train_step": ("policy_params", "optimizer_state"), "proximal_logprobs": ("policy_params",),
              "reference_logprobs": ("reference",), "critic_values": ("critic_params",),
              "critic_step": ("critic_params", "critic_optimizer_state")}


def programs_for(config) -> tuple[str, ...]:
    """The programs a run of `config` executes, in PROGRAMS order."""
    return tuple(p for p in PROGRAMS if p not in OPTIONAL or OPTIONAL[p][0](config))


def shard_bytes(tree) -> int:
    """Bytes one device holds of abstract arrays `tree` (each leaf's shard shape under its sharding)."""
    return int(sum(np.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(tree)))


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


def with_attention_kernel(model_config: ModelConfig, mesh) -> ModelConfig:
    """model_config with `attention_impl` resolved for the mesh's platform (compile-only TPU devices: "tpu", so
    "auto" compiles splash attention; `attention_kernels.select_attention_kernel`)."""
    platform = mesh.devices.flat[0].platform
    return model_config.replace(attention_impl=config_kernel(model_config, platform))


class Programs:
    """Abstract inputs and jitted programs of one run config on one mesh (see the module docstring)."""

    def __init__(self, config, model_config: ModelConfig, mesh, shapes: RunShapes):
        model_config = with_attention_kernel(model_config, mesh)
        self.config, self.model_config, self.mesh, self.shapes = config, model_config, mesh, shapes
        self.module = VisionLanguageModel(model_config)
        shapes_tree = init_params_shapes(model_config)
        self.params = _abstract(shapes_tree, partition.param_shardings(shapes_tree, mesh))
        self.trainable_count, self.param_count = trainable.count(shapes_tree, model_config)
        self.optimizer_config = optimizer_settings(config)
        optimizer = trainable.masked_optimizer(make_optimizer(self.optimizer_config)[0], model_config)
        opt_shapes = jax.eval_shape(optimizer.init, shapes_tree)      # the trainable weights' moments only
        self.opt_state = _abstract(opt_shapes, partition.state_shardings(opt_shapes, mesh))
        self.settings = update_settings(config)
        self.separate_prox = OPTIONAL["proximal_logprobs"][0](config)   # else the train step reads its own forward
        self.logprobs_fn, self.step_fn = _compiled(self.module, self.settings, self.optimizer_config)
        self.reference = self._reference(shapes_tree)
        self.critic, self.critic_state = self._critic(shapes_tree)

    def _reference(self, shapes_tree):
        """The frozen reference's abstract params (the policy's structure in `actor.ref_dtype`, on the policy's
        partition rules), or None when no KL term reads it."""
        if not reference.needed(self.config):
            return None
        held = reference.held_template(shapes_tree, self.config.actor.ref_dtype)
        return _abstract(held, partition.param_shardings(held, self.mesh))

    def _critic(self, shapes_tree):
        """(the run's ValueModel, its abstract CriticState: a copy of the trunk + zero value head, their AdamW state),
        or (None, None) without `critic.enabled`."""
        if not self.config.critic.enabled:
            return None, None
        # value_model reads only the policy's module and ModelConfig; there is no Policy object in an AOT compile
        critic = value_model(self.config, types.SimpleNamespace(module=self.module, config=self.model_config))
        params = jax.eval_shape(lambda p: value_head.value_model_params(p, self.model_config), shapes_tree)
        opt = jax.eval_shape(critic.optimizer.init, params)
        # the trunk on the policy's shardings (`init_state` copies the policy's arrays), the value head replicated
        return critic, CriticState(_abstract(params, partition.state_shardings(params, self.mesh, "value_head")),
                                   _abstract(opt, partition.state_shardings(opt, self.mesh, "value_head")))

    def resident_bytes(self, name: str) -> dict[str, int] | None:
        """Bytes a chip holds through train-side program `name` besides its arguments (the Updater keeps the
        policy's weights and AdamW state, the reference unless `actor.ref_offload`, and the critic's state live
        across its passes), by part, with their "total"; None for the policy server's programs."""
        if name not in _ARGUMENTS:
            return None
        held = {"policy_params": self.params, "optimizer_state": self.opt_state,
                "reference": None if self.config.actor.ref_offload else self.reference,
                "critic_params": None if self.critic_state is None else self.critic_state.params,
                "critic_optimizer_state": None if self.critic_state is None else self.critic_state.opt_state}
        parts = {k: shard_bytes(v) for k, v in held.items() if v is not None and k not in _ARGUMENTS[name]}
        return {**parts, "total": sum(parts.values())}

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
                       prox_logprobs=(_batch(mesh, (rows, t), jnp.float32) if train and self.separate_prox
                                      else None),   # else the step's own forward's (update.prox_from_own_forward)
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
        if not self.separate_prox:
            raise ValueError(f"proximal_logprobs needs {OPTIONAL['proximal_logprobs'][1]}")
        mb, grid = self.minibatch(train=False)
        compiled, seconds = _compile(self.mesh, lambda: self.logprobs_fn.lower(self.params, mb, grid=grid))
        s = self.shapes
        work = cost.forward(self.model_config, rows=s.rows, seq_len=s.seq_len, grids_per_row=s.grids_per_row,
                            positions=s.positions, devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.rows, "seq_len": s.seq_len}

    def reference_logprobs(self):
        """The reference's pass: the proximal pass's jitted program on the reference's weights (another compile
        when `actor.ref_dtype` differs from the params'), on the device whether or not it is offloaded between."""
        if self.reference is None:
            raise ValueError(f"reference_logprobs needs {OPTIONAL['reference_logprobs'][1]}")
        mb, grid = self.minibatch(train=False)
        compiled, seconds = _compile(self.mesh, lambda: self.logprobs_fn.lower(self.reference, mb, grid=grid))
        s = self.shapes
        work = cost.forward(self.model_config, rows=s.rows, seq_len=s.seq_len, grids_per_row=s.grids_per_row,
                            positions=s.positions, devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.rows, "seq_len": s.seq_len,
                                         "ref_dtype": self.config.actor.ref_dtype or self.model_config.param_dtype,
                                         "ref_offload": bool(self.config.actor.ref_offload)}

    def critic_values(self):
        """The critic's V [R, T] before any update (GAE's values): its trunk's forward and the value head on every
        token (costed as the policy's forward without the LM head)."""
        critic = self._critic_or_raise("critic_values")
        mb, grid = self.minibatch(train=False)
        compiled, seconds = _compile(self.mesh, lambda: critic._values.lower(self.critic_state.params, mb, grid=grid))
        s = self.shapes
        work = cost.forward(self.model_config, rows=s.rows, seq_len=s.seq_len, grids_per_row=s.grids_per_row,
                            positions=0, devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.rows, "seq_len": s.seq_len}

    def critic_step(self):
        """One clipped value-loss AdamW step of the critic (forward + backward of its trunk; costed as a policy
        train step without the LM head, over the trunk's parameters)."""
        critic = self._critic_or_raise("critic_step")
        mb, grid = self.minibatch(train=False)
        s, mesh = self.shapes, self.mesh
        rows = (_batch(mesh, (s.rows, s.seq_len), jnp.float32), _batch(mesh, (s.rows, s.seq_len), jnp.float32),
                _batch(mesh, (s.rows, s.seq_len), jnp.int32))   # returns, old values, value mask
        compiled, seconds = _compile(mesh, lambda: critic._step.lower(self.critic_state, mb, *rows, grid=grid))
        count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.critic_state.params))
        work = cost.train_step(self.model_config, rows=s.rows, seq_len=s.seq_len, grids_per_row=s.grids_per_row,
                               positions=0, param_count=count, moments_dtype=self.optimizer_config.moments_dtype,
                               devices=mesh.size, tensor=mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.rows, "seq_len": s.seq_len, "critic_param_count": count}

    def _critic_or_raise(self, name: str):
        if self.critic is None:
            raise ValueError(f"{name} needs {OPTIONAL[name][1]}")
        return self.critic

    @property
    def server_config(self) -> ModelConfig:
        """The policy server's model: a LoRA run's merged weights (`policy.merged_policy`), no adapters, stored in
        the serving dtype (`rollout.serve_dtype`: by default the compute dtype, `models/serving_weights.py`)."""
        c = self.model_config
        dtype = serving_dtype(self.config.rollout.serve_dtype, c)
        return c.replace(lora=None, param_dtype=jnp.dtype(dtype).name)

    def _sampler(self):
        r = self.config.rollout
        sampler = Sampler(VisionLanguageModel(self.server_config), self.server_config, decode_chunk=int(r.decode_chunk),
                          mesh=self.mesh, batch_multiple=min(4, int(r.server_max_batch)),
                          decode_block=int(r.decode_block))
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
                                                                  jnp.dtype(self.model_config.dtype),
                                                                  decode_block=sampler.decode_block))
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
            # the mesh in context: XLA does not partition a Pallas kernel (the tower's splash attention), it runs per
            # shard under the mesh (`attention_kernels.splash_attention`); the policy server's Sampler is one device
            compiled, seconds = _compile(self.mesh, lambda: sampler._prefill.lower(*args, **kwargs))
            self._prefill_cache = (sampler, args, kwargs, compiled, seconds)
        return self._prefill_cache

    def prefill(self):
        _, _, _, compiled, seconds = self._compiled_prefill()
        s = self.shapes
        work = cost.prefill(self.server_config, rows=s.server_rows, prompt_len=s.prompt_len,
                            grids_per_row=s.grids_per_row, devices=self.mesh.size, tensor=self.mesh.shape["tensor"])
        return compiled, seconds, work, {"rows": s.server_rows, "prompt_len": s.prompt_len,
                                         "cache_len": s.prompt_len + s.max_new_tokens}

    def decode(self):
        sampler, args, kwargs, prefill, _ = self._compiled_prefill()
        with jax.set_mesh(self.mesh):   # as the prefill was compiled (a Pallas kernel lowers per shard)
            out_info = sampler._prefill.lower(*args, **kwargs).out_info
        state = jax.tree.map(lambda info, sh: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sh),
                             out_info, prefill.output_shardings)
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
        out["attention_kernel"] = built.model_config.attention_impl
        if name == "train_step":
            out["state_bytes_per_device"] = built.state_bytes_per_device()
        resident = built.resident_bytes(name)
        if resident is not None:   # the train state held through this pass counts against the chip too
            out["hbm_resident_bytes_per_device"] = resident
            needed = (out["hbm_bytes_per_device"]["total"] or 0) + resident["total"]
            out["fits"] = bool(out["fits"]) and needed <= chip.hbm_bytes
        yield out
