"""One train step of the policy: proximal log-probs, the advantage path, then minibatch × epoch optax updates.

A train step takes a batch of step rows (padded `[B, T]` arrays, see `UpdateBatch`) and:
  1. splits the rows into `ppo_n_minibatches` of equal row count balanced by policy tokens
     (`assembly.balanced_minibatches`) and recomputes the proximal log-probs log π_prox with the current params
     (no gradient) — the decoupled loss's anchor, distinct from the behaviour log-probs the sampler recorded —
     and, in a KL run, the frozen reference's log π_ref in the same pass (`train/reference.py`); a step of one
     minibatch update without a reference reads them off that update's own forward (`prox_from_own_forward`);
  2. runs jaxwebrl.rl's advantage path (group norm → r̂/k or r̂/|τ| → last token → KL in the reward → masked GAE;
     with a value model, `train/critic.py`, GAE reads its values and each actor minibatch update is followed by a
     critic one);
  3. runs `ppo_n_epochs` passes of AdamW (grad-norm clip, schedule) over the minibatches on the registered loss
     (+ `kl_loss_coef` × KL to the reference, `rl.regularizers.actor_objective`), each minibatch a jitted update
     with donated params and optimizer state.

Non-finite guard (`skip_non_finite`, the config's `train.rollback_non_finite`): a minibatch update whose loss or
gradient norm is not finite is skipped inside the jitted step (params and optimizer state selected back, bit for
bit, on the donated buffers: no copy of the train state anywhere), counted in the stats (`skipped_updates`) and
left out of the logged means.

Normaliser: each minibatch's loss is aggregated over that minibatch alone (token-mean: its sum over its own policy
tokens / their count, the dropped tokens included), and each minibatch is one AdamW step, as in AReaL. Balancing
keeps those denominators near equal, so every token weighs about the same in the train step. A minibatch without
policy tokens (fewer token-carrying rows than minibatches) gets no forward pass and no optimizer step: its zero
gradient would still move the weights through Adam's moments and weight decay.

Log-probs (proximal and current) replay the sampler's transformation exactly (`token_logprobs`): the action
constraint, the temperature, and top-k / top-p truncation, so they are log-probs of the same distribution the
behaviour log-probs were recorded under. Log-probs, ratios and the loss are fp32 whatever the compute dtype.

The jitted functions take one `Minibatch` (a NamedTuple, so a pytree: its None fields are empty subtrees and
change only the static structure), the static image grid and the static length groups. A minibatch carries each
distinct screenshot its rows show once (`image_index` points the rows at them: with a prompt window, consecutive
steps share screenshots), and its rows, longest first, run in a few groups each padded to its own length bucket
(`train/length_layouts.py`, the config's `train.length_groups`, at most `train.length_layouts` compiled layouts per
minibatch shape): the vision tower and the decoder do no repeated and little padded work.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwebrl.models import lm_head, vision_layout
from jaxwebrl.models.sampling_transform import LOGPROB_FLOOR  # noqa: F401  (re-exported: the replay floor)
from jaxwebrl.parallel import partition
from jaxwebrl.parallel.mesh import context_batch_divisor
from jaxwebrl.parallel.precision import with_moments_dtype
from jaxwebrl.rl import advantages as adv_lib
from jaxwebrl.rl import gae as gae_lib
from jaxwebrl.rl import kl as kl_lib
from jaxwebrl.rl import losses, regularizers
from jaxwebrl.train import trainable
from jaxwebrl.train.assembly import UpdateBatch, balanced_minibatches
from jaxwebrl.train.length_layouts import LengthLayouts

log = logging.getLogger(__name__)


class Minibatch(NamedTuple):
    """What one jitted forward / update reads: device arrays of R rows, T tokens.

    input_ids, attention_mask, loss_mask (the objective's tokens) [R, T] int32; behave_logprobs [R, T] float32;
    advantages [R, T] float32 (update only); loss_positions [R, P] int32 (`lm_head.loss_positions`; None: every
    position); prox_logprobs [R, T] float32 (update only; None: the step's own forward's, `prox_from_own_forward`);
    ref_logprobs [R, T] float32 (the reference's, for a KL loss term only); constraint_states [R, T] int32 and
    allowed_table [S, V] bool (decoded under an action constraint only); pixel_values [N_patches, D] float32, the
    patches of each distinct image the rows show, once (padded to a bucket of images), and image_index [R, K] int32,
    row r's k-th image as an index into them (-1: none) (rows with images only). An absent field is None.
    """

    input_ids: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    behave_logprobs: jax.Array
    advantages: jax.Array | None = None
    loss_positions: jax.Array | None = None
    prox_logprobs: jax.Array | None = None
    ref_logprobs: jax.Array | None = None
    constraint_states: jax.Array | None = None
    allowed_table: jax.Array | None = None
    pixel_values: jax.Array | None = None
    image_index: jax.Array | None = None


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
    temperature: float = 1.0           # the sampler's (model.temperature/top_k/top_p): log-probs replay them
    top_k: int = 0
    top_p: float = 1.0
    advantage: adv_lib.AdvantageConfig = adv_lib.AdvantageConfig()
    kl_loss_coef: float = 0.0          # × KL(π || π_ref) added to the loss (veRL's use_kl_loss)
    kl_loss_estimator: str = "k3"
    skip_non_finite: bool = True       # the in-jit guard (module docstring)
    length_groups: int = 1             # rows of a minibatch run in up to this many groups, each at its own width
    length_layouts: int = 8            # ... in at most this many compiled layouts per minibatch shape (+ full width)


LR_SCHEDULES = ("constant", "cosine")


def schedule_problem(schedule) -> str | None:
    """What is wrong with a learning-rate schedule's name (train.lr_schedule), or None."""
    return None if schedule in LR_SCHEDULES else f"use {' or '.join(map(repr, LR_SCHEDULES))}"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW + global grad-norm clip; the schedule counts train steps of `updates_per_step` optax updates."""

    lr: float
    total_steps: int
    schedule: str = "constant"        # one of LR_SCHEDULES
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
    fix = schedule_problem(c.schedule)
    if fix is not None:
        raise ValueError(f"train.lr_schedule={c.schedule!r}: {fix}")
    if c.schedule == "constant":
        body = optax.constant_schedule(c.lr)
    else:
        body = optax.cosine_decay_schedule(c.lr, max(1, total_updates - warmup))
    lr_fn = optax.join_schedules([optax.linear_schedule(0.0, c.lr, warmup), body], [warmup]) if warmup else body
    chain = [optax.clip_by_global_norm(c.max_grad_norm)] if c.max_grad_norm else []
    chain.append(optax.adamw(lr_fn, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay))
    tx = optax.chain(*chain)
    return (tx if c.moments_dtype is None else with_moments_dtype(tx, c.moments_dtype)), lr_fn


def token_logprobs(hidden: jax.Array, params, config, input_ids: jax.Array, temperature: float = 1.0, *,
                   top_k: int = 0, top_p: float = 1.0, states: jax.Array | None = None, allowed_table: jax.Array | None = None,
                   positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(log π(x_t | x_<t), entropy of π(· | x_<t)) from the decoder's hidden states [B, T, E]: two [B, T] float32.

    π is the distribution the sampler draws from (`sampling_transform.sampling_logits`: action grammar,
    temperature, top-k, top-p). The LM head runs on `positions` [B, K] only (the tokens that carry
    loss, `lm_head.loss_positions`; 0 elsewhere) or on every position t ≥ 1 when None, over
    `config.logits_chunk` vocabulary entries at a time: no [B, T, V] logits (`lm_head.token_logprobs`).
    states [B, T] int32 (-1: unrestricted) and allowed_table [S, V] bool: the action grammar each token was drawn
    under. With truncation, a token outside the current top-k / top-p set has log-prob `LOGPROB_FLOOR`, no
    gradient. Position 0 gets 0.
    """
    return lm_head.token_logprobs(hidden, lm_head.head_weight(params, config.tie_word_embeddings), input_ids,
                                  compute_dtype=config.dtype, temperature=temperature,
                                  top_k=top_k, top_p=top_p, states=states,
                                  allowed_table=allowed_table, positions=positions, chunk=config.logits_chunk)


def _masked_mean(x, mask):
    mask = mask.astype(jnp.float32)
    return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)


@jax.jit
def _policy_token_means(token_rewards, advantages, loss_mask):
    """(mean token reward, mean advantage) over the policy tokens of the real rows: two scalars."""
    return _masked_mean(token_rewards, loss_mask), _masked_mean(advantages, loss_mask)


def _forward_logprobs(module, settings: "UpdateSettings", params, mb: Minibatch, grid, groups=None):
    """(logprobs, entropy) [R, T] of minibatch `mb` under `params` (see token_logprobs).

    groups: static ((rows, width), ...) in row order (`length_groups`), or None (one group, every row at full
    width). Each group's rows run through the decoder and the LM head at their own width, the images encoded once
    for all of them; the outputs are padded back to [R, T] (0 past a group's width: no token of its rows is there).
    """
    rows_total, width_total = mb.input_ids.shape
    groups = groups or ((rows_total, width_total),)
    grid = None if grid is None else np.asarray(grid, np.int64)
    features = None
    if mb.pixel_values is not None and len(groups) > 1:
        features = module.apply({"params": params}, mb.pixel_values, grid, method="encode_images")
    outs, start = [], 0
    for rows, width in groups:
        part = mb._replace(**{name: _block(getattr(mb, name), start, rows, width)
                              for name in ("input_ids", "attention_mask", "constraint_states")},
                           **{name: _block(getattr(mb, name), start, rows)
                              for name in ("image_index", "loss_positions")})
        hidden, _ = module.apply({"params": params}, part.input_ids, attention_mask=part.attention_mask,
                                 pixel_values=None if features is not None else mb.pixel_values,
                                 image_features=features, image_grid_thw=grid, head="none",
                                 image_index=part.image_index)
        logprobs, entropy = token_logprobs(
            hidden, params, module.config, part.input_ids, settings.temperature, top_k=settings.top_k,
            top_p=settings.top_p, states=part.constraint_states, allowed_table=mb.allowed_table,
            positions=part.loss_positions)
        outs.append([jnp.pad(x, ((0, 0), (0, width_total - width))) for x in (logprobs, entropy)])
        start += rows
    if len(outs) == 1:
        return tuple(outs[0])
    return tuple(jnp.concatenate(parts) for parts in zip(*outs))


def _block(x: jax.Array | None, start: int, rows: int, width: int | None = None) -> jax.Array | None:
    """Rows [start, start + rows) of x (and its first `width` columns when given); None stays None."""
    return None if x is None else x[start:start + rows, :width]


def prox_from_own_forward(epochs: int, minibatches: int, reference: bool) -> bool:
    """Whether a train step of `epochs` passes over `minibatches` reads π_prox off its update's own forward: true
    for one minibatch update and no reference (π_prox is then the params that update starts from; a reference's KL
    needs π_prox before any update), so the step makes no separate proximal pass."""
    return epochs * minibatches == 1 and not reference


@functools.lru_cache(maxsize=None)
def _compiled(module, settings: UpdateSettings, optimizer_config: OptimizerConfig):
    """(logprobs_fn, step_fn) jitted once per (module, settings, optimizer): every Updater alike shares them.
    The step differentiates and updates the trainable weights only (`trainable.py`: LoRA, freeze_vision)."""
    optimizer, _ = make_optimizer(optimizer_config)
    losses.get_loss(settings.loss)   # an unknown name fails here, not inside the trace

    def logprobs_fn(params, mb: Minibatch, grid, groups=None):
        return _forward_logprobs(module, settings, params, mb, grid, groups)[0]

    def step_fn(params, opt_state, mb: Minibatch, grid, groups=None):
        """mb.prox_logprobs None: π_prox is `params` themselves (the step's only minibatch update, `Updater`), so
        the proximal log-probs are this forward's own, detached, not a second forward pass."""
        mask = mb.loss_mask
        train, frozen = trainable.split(params, module.config)

        def objective(p):
            logprobs, entropy = _forward_logprobs(module, settings, trainable.combine(p, frozen), mb, grid, groups)
            prox = jax.lax.stop_gradient(logprobs) if mb.prox_logprobs is None else mb.prox_logprobs
            behave = mb.behave_logprobs if settings.use_decoupled_loss else prox
            loss, stats = regularizers.actor_objective(
                settings.loss, logprobs, prox, behave, mb.advantages, mask,
                loss_kwargs=settings.loss_kwargs, ref_logprobs=mb.ref_logprobs, kl_coef=settings.kl_loss_coef,
                kl_estimator=settings.kl_loss_estimator)
            return loss, (dict(stats, entropy=_masked_mean(entropy, mask)), logprobs, prox)

        (loss, (stats, logprobs, prox)), grads = jax.value_and_grad(objective, has_aux=True)(train)
        grad_norm = optax.global_norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, train)
        new_train = optax.apply_updates(train, updates)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        if settings.skip_non_finite:   # select on the donated buffers, no state copy (its cost: docs/scaling.md)
            train, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                            (new_train, new_opt_state), (train, opt_state))
        else:
            train, opt_state = new_train, new_opt_state
        # the updated state on its input's layout (the partition rules): no recompile, no drift, donation aliases
        params, opt_state = partition.constrain_state((trainable.combine(train, frozen), opt_state))
        logprobs = jax.lax.stop_gradient(logprobs)
        out = {f"loss_stats/{k}": jnp.asarray(v, jnp.float32).mean() for k, v in stats.items()}
        out.update(actor_loss=loss.astype(jnp.float32), grad_norm=grad_norm,
                   approx_kl_abs=_masked_mean(jnp.abs(logprobs - prox), mask),
                   behave_approx_kl_abs=_masked_mean(jnp.abs(logprobs - mb.behave_logprobs), mask),
                   policy_tokens=mask.sum().astype(jnp.float32),
                   skipped=(~finite if settings.skip_non_finite else jnp.bool_(False)).astype(jnp.float32))
        return params, opt_state, out

    return (jax.jit(logprobs_fn, static_argnames=("grid", "groups")),
            jax.jit(step_fn, static_argnames=("grid", "groups"), donate_argnums=(0, 1)))


class Updater:
    """`updater(params, opt_state, batch) -> (params, opt_state, stats)`; params and opt state are donated.

    `updater.optimizer.init(params)` makes the optimizer state; `updater.lr_fn(count)` is the schedule.
    """

    def __init__(self, module, settings: UpdateSettings, optimizer_config: OptimizerConfig,
                 allowed_table: np.ndarray | None = None, reference=None, critic=None):
        """allowed_table: [S, V] bool, the action constraint's `allowed` when the policy decodes under one (the
        batches then carry `constraint_states`). reference: the frozen reference (`train.reference.Reference`),
        needed when the settings hold a KL term (kl_ctl or kl_loss_coef > 0). critic: a `train.critic.ValueModel`
        (critic PPO) or None; its `state` is updated in place by every call."""
        if (settings.advantage.kl_ctl or settings.kl_loss_coef) and reference is None:
            raise ValueError("kl_ctl or kl_loss_coef > 0 needs the reference policy: pass reference= "
                             "(jaxwebrl.train.reference.load_reference)")
        self.module = module
        self.reference = reference
        self.critic = critic
        self.allowed_table = None if allowed_table is None else jnp.asarray(allowed_table, bool)
        self.settings = settings
        self._layouts = LengthLayouts(settings.length_groups, settings.length_layouts)
        tx, self.lr_fn = make_optimizer(optimizer_config)
        self.optimizer = trainable.masked_optimizer(tx, module.config)   # state for the trainable weights only
        self._logprobs, self._step = _compiled(module, settings, optimizer_config)
        self._advantages = adv_lib.jitted_token_advantages(settings.advantage)

    # ------------------------------------------------------------------ host driver
    def __call__(self, params, opt_state, batch: UpdateBatch, should_stop=None):
        """One train step. `should_stop()` is checked between minibatch updates: when it turns true the step is
        abandoned with UpdateInterrupted (the donated params are gone: resume from the last checkpoint).

        Every per-token quantity of the step lives on the device in one layout, `[B, T]` in batch row order: the
        proximal (and reference) log-probs are computed minibatch by minibatch and placed once
        (`_in_batch_order`), the advantage path runs once on the whole batch, and each minibatch takes its rows of
        all of them once (`_rows`); only the logged means come back to the host."""
        s, critic = self.settings, self.critic
        n_real = batch.num_real_rows
        minibatches = [m for m in self._split(batch) if m.policy_tokens > 0]
        rows = [jnp.asarray(m.rows) for m in minibatches]
        shape = batch.input_ids.shape
        prox = None if self._own_prox(minibatches) else _in_batch_order(
            [self._logprobs(params, m.minibatch, m.grid, m.groups) for m in minibatches], rows, shape)
        ref = ref_kl = None
        extra = {}
        if self.reference is not None:   # the reference's, in the same pass and LM-head chunks
            with self.reference.on_device() as ref_params:
                ref = _in_batch_order([self._logprobs(ref_params, m.minibatch, m.grid, m.groups)
                                       for m in minibatches], rows, shape)
            ref_kl = float(_ref_kl(prox, ref, jnp.asarray(batch.objective_mask)))
            if s.advantage.kl_ctl:
                extra.update(logprobs=prox, ref_logprobs=ref)
        if s.advantage.gae_timestep_unit == "turn":
            extra["turn_ids"] = np.asarray(gae_lib.turn_ids_from_mask(batch.loss_mask))
        if critic is not None:   # V before any update: GAE's values and the value clip's anchor
            values, old_values = critic.batch_values(minibatches, shape)
            extra["values"] = values
        # the whole padded batch, its padding rows marked: one static [B, T] shape whatever the real-row count
        padding = ((0, shape[0] - n_real),)
        ids = [np.pad(real_ids, padding, constant_values=-1) for real_ids in (batch.episode_ids, batch.group_ids)]
        trace = self._advantages(np.pad(batch.rewards, padding), *ids, batch.loss_mask,
                                 row_valid=np.arange(shape[0]) < n_real, **extra)
        advantages = trace.advantages   # [B, T]
        if critic is not None:
            returns, value_mask = trace.returns, jnp.asarray(critic.value_mask(batch.loss_mask))
        for m, r in zip(minibatches, rows):   # the reference's log-probs stay only for a KL loss
            m.minibatch = m.minibatch._replace(
                **_rows(r, prox_logprobs=prox, advantages=advantages, ref_logprobs=ref if s.kl_loss_coef else None))
        per_update: list[dict[str, Any]] = []
        for _ in range(s.n_epochs):
            for i, (m, r) in enumerate(zip(minibatches, rows)):
                if should_stop is not None and should_stop():
                    raise UpdateInterrupted("train step abandoned on request")
                params, opt_state, stats = self._step(params, opt_state, m.minibatch, m.grid, m.groups)
                if critic is not None:
                    taken = _rows(r, returns=returns, value_mask=value_mask)
                    stats = {**stats, **critic.update(m.minibatch, m.grid, taken["returns"], old_values[i],
                                                      taken["value_mask"])}
                per_update.append(stats)
        per_update = [{k: float(v) for k, v in u.items()} for u in per_update]
        kept = [u for u in per_update if not u["skipped"]] or per_update   # all skipped: their (non-finite) means
        if per_update:
            stats = {k: float(np.mean([u[k] for u in kept])) for k in per_update[0] if k != "skipped"}
        else:
            log.warning("no policy token carries loss in this batch of %d rows: no optimizer step", n_real)
            stats = dict.fromkeys(("actor_loss", "grad_norm", "approx_kl_abs", "behave_approx_kl_abs",
                                   "policy_tokens"), 0.0)
        final_reward, mean_advantage = _policy_token_means(trace.token_rewards, trace.advantages, batch.loss_mask)
        stats["final_reward"], stats["advantages"] = float(final_reward), float(mean_advantage)
        stats["optimizer_updates"] = len(per_update)
        stats["skipped_updates"] = int(sum(u["skipped"] for u in per_update))
        if ref_kl is not None:
            stats["ref_kl"] = ref_kl
        return params, opt_state, stats

    def _own_prox(self, minibatches: list["Split"]) -> bool:
        """Whether this step's one update reads π_prox off its own forward (`prox_from_own_forward`)."""
        return prox_from_own_forward(self.settings.n_epochs, len(minibatches), self.reference is not None)

    def proximal_logprobs(self, params, batch: UpdateBatch) -> np.ndarray:
        """[B, T] float32 log-probs of `batch` under `params` (as the update recomputes them), rows in batch order."""
        minibatches = self._split(batch)
        parts = [self._logprobs(params, m.minibatch, m.grid, m.groups) for m in minibatches]
        return np.asarray(_in_batch_order(parts, [jnp.asarray(m.rows) for m in minibatches], batch.input_ids.shape))

    def _split(self, batch: UpdateBatch) -> list["Split"]:
        """`n_minibatches` minibatches of equal row count, balanced by policy tokens, each with its rows' images."""
        s = self.settings
        rows = batch.input_ids.shape[0]
        if rows % s.n_minibatches:
            raise ValueError(f"batch of {rows} rows does not split into ppo_n_minibatches={s.n_minibatches}; "
                             "pad rows to a multiple (see assembly.row_bucket)")
        if batch.constraint_states is not None and self.allowed_table is None:
            raise ValueError("the batch was decoded under an action constraint (constraint_states is set) "
                             "but the Updater has no allowed_table: pass the constraint's `allowed`")
        objective = batch.objective_mask
        tokens = objective.sum(axis=1)
        images = _DistinctImages(batch) if batch.pixel_values is not None else None
        out = []
        lengths = batch.attention_mask.sum(axis=1)
        for index in balanced_minibatches(tokens, s.n_minibatches):
            # groups of whole batch shards under a trainer mesh (`jax.set_mesh`), so each splits over its chips
            order, groups = self._layouts(lengths[index], batch.input_ids.shape[1], context_batch_divisor())
            index = index[order]
            grid = pixels = image_index = None
            if images is not None:
                pixels, grid, image_index = images.of_rows(index)
            constrained = batch.constraint_states is not None
            mb = Minibatch(
                input_ids=jnp.asarray(batch.input_ids[index], jnp.int32),
                attention_mask=jnp.asarray(batch.attention_mask[index], jnp.int32),
                loss_mask=jnp.asarray(objective[index], jnp.int32),
                behave_logprobs=jnp.asarray(batch.behave_logprobs[index], jnp.float32),
                loss_positions=jnp.asarray(lm_head.loss_positions(objective[index])),        # LM-head bucket
                constraint_states=jnp.asarray(batch.constraint_states[index], jnp.int32) if constrained else None,
                allowed_table=self.allowed_table if constrained else None,
                pixel_values=None if pixels is None else jnp.asarray(pixels),
                image_index=None if image_index is None else jnp.asarray(image_index))
            out.append(Split(rows=index, minibatch=mb, grid=grid, groups=groups,
                             policy_tokens=int(tokens[index].sum())))
        return out


@jax.jit
def _ref_kl(prox_logprobs, ref_logprobs, loss_mask):
    """Mean k3 estimate of KL(π || π_ref) over the policy tokens: a scalar (`ref_kl`, >= 0, 0 at equal weights)."""
    return _masked_mean(kl_lib.kl_estimate(prox_logprobs, ref_logprobs, "k3"), loss_mask)


@functools.partial(jax.jit, static_argnames=("shape",))
def _in_batch_order(parts: list[jax.Array], rows: list[jax.Array], shape: tuple[int, int]) -> jax.Array:
    """[B, T] float32: the minibatches' [R, T] `parts` placed at their `rows` [R] in one scatter (0 in the rows of
    no minibatch: they carry no policy token)."""
    out = jnp.zeros(shape, jnp.float32)
    if not parts:
        return out
    return out.at[jnp.concatenate(rows)].set(jnp.concatenate(parts).astype(jnp.float32))


@jax.jit
def _rows(rows: jax.Array, **fields: jax.Array | None) -> dict:
    """Each [B, T] field's rows `rows` [R] (a None field stays None): a minibatch's share, taken once."""
    return {name: None if x is None else x[rows] for name, x in fields.items()}


@dataclasses.dataclass
class Split:
    """One minibatch of a train step: `rows` [R] indices into the batch (longest first), the jitted functions'
    Minibatch, its static image grid and length groups (`length_groups`), its policy-token count."""

    rows: np.ndarray
    minibatch: Minibatch
    grid: tuple | None
    groups: tuple
    policy_tokens: int


class _DistinctImages:
    """The distinct images any subset of a batch's rows shows, each once, and the rows' index into them."""

    def __init__(self, batch: UpdateBatch):
        self.pixel_values = batch.pixel_values
        self.grid = batch.image_grid_thw
        self.image_index = np.asarray(batch.image_index, np.int64)                   # [B, K]
        patches = np.prod(self.grid, axis=-1).astype(np.int64)                        # [U]
        self.first_patch = np.cumsum(patches) - patches
        self.patches = patches

    def of_rows(self, rows: np.ndarray):
        """(pixel_values [P, D], static grid key, image_index [R, K] int32 into them) of `rows`, or three Nones
        when they show no image. The distinct images are padded to a bucket (`vision_layout.bucketed_image_order`:
        copies of the last, which no row points at) so a varying count compiles a few grids, not one per count."""
        index = self.image_index[rows]
        shown = np.unique(index[index >= 0])
        if shown.size == 0:
            return None, None, None
        local = np.full(len(self.grid), -1, np.int64)
        local[shown] = np.arange(shown.size)
        row_index = np.where(index >= 0, local[np.maximum(index, 0)], -1).astype(np.int32)
        images = vision_layout.bucketed_image_order(shown)
        patch_index = np.concatenate([np.arange(self.first_patch[i], self.first_patch[i] + self.patches[i])
                                      for i in images])
        return self.pixel_values[patch_index], _grid_key(self.grid[images]), row_index


def _grid_key(grid) -> tuple:
    """Hashable static form of a concrete image grid [N, 3]."""
    return tuple(tuple(int(v) for v in row) for row in np.asarray(grid).reshape(-1, 3))
