"""One train step of the policy: proximal log-probs, the advantage path, then minibatch × epoch optax updates.

A train step takes a batch of step rows (padded `[B, T]` arrays, see `UpdateBatch`) and:
  1. recomputes the proximal log-probs log π_prox with the current params (no gradient) — the decoupled
     loss's anchor, distinct from the behaviour log-probs the sampler recorded;
  2. runs jaxwebrl.rl's advantage path (group norm → r̂/k or r̂/|τ| → last token → masked GAE);
  3. splits the rows into `ppo_n_minibatches` and runs `ppo_n_epochs` passes of AdamW (grad-norm clip,
     schedule) on the registered loss, each minibatch a jitted update with donated params and optimizer state.
Log-probs, ratios and the loss are fp32 whatever the compute dtype.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwebrl.models import lm_head
from jaxwebrl.parallel.precision import with_moments_dtype
from jaxwebrl.rl import advantages as adv_lib
from jaxwebrl.rl import losses
from jaxwebrl.train.assembly import UpdateBatch


class UpdateInterrupted(RuntimeError):
    """A train step was abandoned between minibatch updates (Ctrl-C); its partial update is discarded."""


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """Static knobs of the update (hashable)."""

    loss: str = "ppo"
    loss_kwargs: tuple = ()            # (name, value) pairs for the registered loss
    use_decoupled_loss: bool = True
    n_minibatches: int = 2
    n_epochs: int = 3
    temperature: float = 1.0
    advantage: adv_lib.AdvantageConfig = adv_lib.AdvantageConfig()


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW + global grad-norm clip; the schedule counts train steps of `updates_per_step` optax updates."""

    lr: float
    total_steps: int
    schedule: str = "constant"        # "constant" or "cosine"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0
    updates_per_step: int = 1
    moments_dtype: str | None = None   # AdamW moments dtype (None: the params'); see parallel/precision.py


@functools.lru_cache(maxsize=None)
def make_optimizer(config: OptimizerConfig):
    """(optax.GradientTransformation, lr_fn(optax update count) -> lr); one object per distinct config."""
    c = config
    total_updates = max(1, c.total_steps * c.updates_per_step)
    warmup = c.warmup_steps * c.updates_per_step
    if c.schedule == "constant":
        body = optax.constant_schedule(c.lr)
    elif c.schedule == "cosine":
        body = optax.cosine_decay_schedule(c.lr, max(1, total_updates - warmup))
    else:
        raise ValueError(f"train.lr_schedule={c.schedule!r}: use 'constant' or 'cosine'")
    lr_fn = optax.join_schedules([optax.linear_schedule(0.0, c.lr, warmup), body], [warmup]) if warmup else body
    chain = [optax.clip_by_global_norm(c.max_grad_norm)] if c.max_grad_norm else []
    chain.append(optax.adamw(lr_fn, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay))
    tx = optax.chain(*chain)
    return (tx if c.moments_dtype is None else with_moments_dtype(tx, c.moments_dtype)), lr_fn


def token_logprobs(hidden: jax.Array, params, config, input_ids: jax.Array, temperature: float, *,
                   states: jax.Array | None = None, allowed_table: jax.Array | None = None,
                   positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(log π(x_t | x_<t), entropy of π(· | x_<t)) from the decoder's hidden states [B, T, E]: two [B, T] float32.

    The LM head runs on `positions` [B, K] only (the tokens that carry loss, `lm_head.loss_positions`; 0 elsewhere)
    or on every position t ≥ 1 when None, over `config.logits_chunk` vocabulary entries at a time: no [B, T, V]
    logits.
    states [B, T] int32 (-1: unrestricted) and allowed_table [S, V] bool: the action grammar each token was drawn
    under; the softmax is taken over the allowed tokens only, as the sampler did. Position 0 gets 0.
    """
    return lm_head.token_logprobs(hidden, lm_head.head_weight(params, config.tie_word_embeddings), input_ids,
                                  compute_dtype=config.dtype,
                                  temperature=temperature, states=states, allowed_table=allowed_table,
                                  positions=positions, chunk=config.logits_chunk)


def _masked_mean(x, mask):
    mask = mask.astype(jnp.float32)
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def _forward_logprobs(module, temperature, params, mb, grid):
    """(logprobs, entropy) [B, T] of minibatch `mb` under `params` (see token_logprobs)."""
    hidden, _ = module.apply({"params": params}, mb["input_ids"], attention_mask=mb["attention_mask"],
                             pixel_values=mb.get("pixel_values"),
                             image_grid_thw=None if grid is None else np.asarray(grid, np.int64), head="none")
    return token_logprobs(hidden, params, module.config, mb["input_ids"], temperature,
                          states=mb.get("constraint_states"), allowed_table=mb.get("allowed_table"),
                          positions=mb.get("loss_positions"))


@functools.lru_cache(maxsize=None)
def _compiled(module, settings: UpdateSettings, optimizer_config: OptimizerConfig):
    """(logprobs_fn, step_fn) jitted once per (module, settings, optimizer): every Updater alike shares them."""
    optimizer, _ = make_optimizer(optimizer_config)
    loss_fn = losses.get_loss(settings.loss)
    loss_kwargs = dict(settings.loss_kwargs)

    def logprobs_fn(params, mb, grid):
        return _forward_logprobs(module, settings.temperature, params, mb, grid)[0]

    def step_fn(params, opt_state, mb, grid):
        mask = mb["loss_mask"]
        behave = mb["behave_logprobs"] if settings.use_decoupled_loss else mb["prox_logprobs"]

        def objective(p):
            logprobs, entropy = _forward_logprobs(module, settings.temperature, p, mb, grid)
            loss, stats = loss_fn(logprobs, mb["prox_logprobs"], behave, mb["advantages"], mask, **loss_kwargs)
            return loss, (dict(stats, entropy=_masked_mean(entropy, mask)), logprobs)

        (loss, (stats, logprobs)), grads = jax.value_and_grad(objective, has_aux=True)(params)
        grad_norm = optax.global_norm(grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        logprobs = jax.lax.stop_gradient(logprobs)
        out = {f"loss_stats/{k}": jnp.asarray(v, jnp.float32).mean() for k, v in stats.items()}
        out.update(actor_loss=loss.astype(jnp.float32), grad_norm=grad_norm,
                   approx_kl_abs=_masked_mean(jnp.abs(logprobs - mb["prox_logprobs"]), mask),
                   behave_approx_kl_abs=_masked_mean(jnp.abs(logprobs - mb["behave_logprobs"]), mask),
                   policy_tokens=mask.sum().astype(jnp.float32))
        return params, opt_state, out

    return (jax.jit(logprobs_fn, static_argnames=("grid",)),
            jax.jit(step_fn, static_argnames=("grid",), donate_argnums=(0, 1)))


class Updater:
    """`updater(params, opt_state, batch) -> (params, opt_state, stats)`; params and opt state are donated.

    `updater.optimizer.init(params)` makes the optimizer state; `updater.lr_fn(count)` is the schedule.
    """

    def __init__(self, module, settings: UpdateSettings, optimizer_config: OptimizerConfig,
                 allowed_table: np.ndarray | None = None):
        """allowed_table: [S, V] bool, the action constraint's `allowed` when the policy decodes under one (the
        batches then carry `constraint_states`)."""
        self.module = module
        self.allowed_table = None if allowed_table is None else jnp.asarray(allowed_table, bool)
        self.settings = settings
        self.optimizer, self.lr_fn = make_optimizer(optimizer_config)
        self._logprobs, self._step = _compiled(module, settings, optimizer_config)
        self._advantages = adv_lib.jitted_token_advantages(settings.advantage)

    # ------------------------------------------------------------------ host driver
    def __call__(self, params, opt_state, batch: UpdateBatch, should_stop=None):
        """One train step. `should_stop()` is checked between minibatch updates: when it turns true the step is
        abandoned with UpdateInterrupted (the donated params are gone: resume from the last checkpoint)."""
        s = self.settings
        rows = batch.input_ids.shape[0]
        if rows % s.n_minibatches:
            raise ValueError(f"batch of {rows} rows does not split into ppo_n_minibatches={s.n_minibatches}; "
                             "pad rows to a multiple (see trainer.assemble)")
        n_real = batch.num_real_rows
        real_mask = batch.loss_mask[:n_real]
        trace = self._advantages(batch.rewards[:n_real], batch.episode_ids[:n_real], batch.group_ids[:n_real],
                                 real_mask)
        advantages = np.zeros(batch.loss_mask.shape, np.float32)
        advantages[:n_real] = np.asarray(trace.advantages)
        token_rewards = np.asarray(trace.token_rewards)

        minibatches = self._split(batch, advantages)
        for mb, grid in minibatches:  # proximal log-probs, all before the first update of this step
            mb["prox_logprobs"] = self._logprobs(params, mb, grid)
        per_update: list[dict[str, Any]] = []
        for _ in range(s.n_epochs):
            for mb, grid in minibatches:
                if should_stop is not None and should_stop():
                    raise UpdateInterrupted("train step abandoned on request")
                params, opt_state, stats = self._step(params, opt_state, mb, grid)
                per_update.append(stats)
        stats = {k: float(np.mean([float(u[k]) for u in per_update])) for k in per_update[0]}
        bool_mask = real_mask.astype(bool)
        stats["final_reward"] = float(token_rewards[bool_mask].mean()) if bool_mask.any() else 0.0
        stats["advantages"] = float(advantages[:n_real][bool_mask].mean()) if bool_mask.any() else 0.0
        stats["optimizer_updates"] = len(per_update)
        return params, opt_state, stats

    def proximal_logprobs(self, params, batch: UpdateBatch) -> np.ndarray:
        """[B, T] float32 log-probs of `batch` under `params` (as the update recomputes them)."""
        out = [np.asarray(self._logprobs(params, mb, grid)) for mb, grid in self._split(batch, None)]
        return np.concatenate(out, axis=0)

    def _split(self, batch: UpdateBatch, advantages):
        """Contiguous row chunks, each with its rows' images (static grid per chunk)."""
        s = self.settings
        rows = batch.input_ids.shape[0]
        per = rows // s.n_minibatches
        if batch.pixel_values is not None:
            image_end = np.cumsum(batch.images_per_row)                      # [B] images up to each row
            patch_end = np.cumsum(np.prod(batch.image_grid_thw, axis=-1))    # [N] patches up to each image
        out = []
        for i in range(s.n_minibatches):
            sl = slice(i * per, (i + 1) * per)
            mb = {"input_ids": jnp.asarray(batch.input_ids[sl], jnp.int32),
                  "attention_mask": jnp.asarray(batch.attention_mask[sl], jnp.int32),
                  "loss_mask": jnp.asarray(batch.objective_mask[sl], jnp.int32),
                  "behave_logprobs": jnp.asarray(batch.behave_logprobs[sl], jnp.float32)}
            if advantages is not None:
                mb["advantages"] = jnp.asarray(advantages[sl], jnp.float32)
            mb["loss_positions"] = jnp.asarray(lm_head.loss_positions(batch.objective_mask[sl]))  # LM-head bucket
            if batch.constraint_states is not None:
                if self.allowed_table is None:
                    raise ValueError("the batch was decoded under an action constraint (constraint_states is set) "
                                     "but the Updater has no allowed_table: pass the constraint's `allowed`")
                mb["constraint_states"] = jnp.asarray(batch.constraint_states[sl], jnp.int32)
                mb["allowed_table"] = self.allowed_table
            grid = None
            if batch.pixel_values is not None:
                first_img = int(image_end[i * per - 1]) if i else 0
                last_img = int(image_end[(i + 1) * per - 1])
                if last_img > first_img:
                    first_patch = int(patch_end[first_img - 1]) if first_img else 0
                    mb["pixel_values"] = jnp.asarray(batch.pixel_values[first_patch:int(patch_end[last_img - 1])])
                    grid = _grid_key(batch.image_grid_thw[first_img:last_img])
            out.append((mb, grid))
        return out


def _grid_key(grid) -> tuple:
    """Hashable static form of a concrete image grid [N, 3]."""
    return tuple(tuple(int(v) for v in row) for row in np.asarray(grid).reshape(-1, 3))
