"""The trainer loop: read the ring buffer, gather a filtered batch, update, publish weights v+1, checkpoint, log.

Asynchronous mode (the paper): rollout workers never wait; the trainer trains as soon as `consumer_batch_size`
fresh trajectories are there, and episodes older than `max_head_offpolicyness` versions are dropped.
Synchronous mode (the baseline): the policy server is paused while the trainer updates, so rollout and
training alternate.

Exactly-once across restarts: the checkpoint stores a buffer cursor from which re-reading yields every episode
not yet trained or dropped, plus the ids of those already consumed after that cursor; a restarted trainer reads
from there and skips the consumed ones, so no episode is trained twice and none is skipped.

Nothing is lost silently and no single bad batch stops the run:
- the buffer's read losses (overwritten, lost, incomplete, corrupt) are `buffer/*` metrics and a log line;
- episodes with token ids outside the policy's vocabulary are dropped before they reach jit (counted, logged);
- a minibatch update whose loss or gradient norm is not finite is skipped inside the jitted update
  (`train.rollback_non_finite`, `update.py`'s guard: weights and optimizer state unchanged, no copy of the train
  state kept anywhere) and counted (`trainer/skipped_updates`, a log line); a batch whose every update was skipped
  is skipped before anything is published (a `trainer/skipped_batches` metric, a log line, a record in
  WORKDIR/skipped_batches.jsonl) and consumed, so the next checkpoint's cursor is past it and a resume does not
  meet it again; MAX_SKIPPED_IN_A_ROW skips in a row stop the run (TrainingDiverged). Weights that are not finite
  after a step are never published: the run stops (TrainingDiverged) and resumes from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.buffer.episode import Episode
from jaxwebrl.buffer.screenshots import ScreenshotOverwritten
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.errors import CannotTrain, TrainingDiverged, one_line
from jaxwebrl.models import lora
from jaxwebrl.models.serving_weights import serving_copy, serving_dtype
from jaxwebrl.parallel import distributed
from jaxwebrl.parallel.mesh import batch_divisor
from jaxwebrl.parallel.multihost import NullMetrics
from jaxwebrl.rollout.action_grammar import config_constraint
from jaxwebrl.train import console, reference, rl_config, run_config, totals
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.buffer_reads import BufferReads, losses_of
from jaxwebrl.train.gatherer import BatchGatherer, staleness
from jaxwebrl.train.ledger import ReadLedger
from jaxwebrl.train.metrics import MetricsWriter, memory_metrics
from jaxwebrl.train.start_state import starting_state
from jaxwebrl.train.update import Updater, UpdateInterrupted
from jaxwebrl.train.versions import run_history

log = logging.getLogger(__name__)

MAX_SKIPPED_IN_A_ROW = 3   # skipped batches in a row (same finite weights each time) before the run stops


class WeightSink(Protocol):
    """Where new weights go (the policy server): `set_weights(params, version)`; optional pause/resume."""

    def set_weights(self, params, version: int) -> None: ...


class Trainer:
    """Owns the train state and the loop (see module docstring)."""

    def __init__(self, config, workdir: str, *, policy, buffer, weight_sink: WeightSink,
                 rollout_stats: Callable[[], dict] | None = None, mesh=None,
                 greedy_probe: Callable[[Any, int], float] | None = None):
        self.config = config
        self.workdir = workdir
        self.policy = policy
        self.buffer = buffer
        self.sink = weight_sink
        self.rollout_stats = rollout_stats or (lambda: {})
        self.greedy_probe = greedy_probe   # (params, version) -> greedy success (eval/probe.py); None: not checked
        self.mesh = mesh        # None: one device; else params sharded on it (multi-host: parallel/multihost.py)
        self._rollback = bool(config.train.rollback_non_finite)
        self._held = None       # a batch popped here while another process's was not ready yet
        t = config.train
        optimizer_config = rl_config.optimizer_settings(config)
        self.settings = rl_config.update_settings(config)
        # the policy server's grammar: the policy is restricted to it
        self.constraint = config_constraint(config, policy.processor, policy.config.text.vocab_size)
        self.reference = reference.load_reference(config, workdir, recipe_params=policy.params, mesh=mesh)
        self.critic = rl_config.value_model(config, policy)   # critic PPO's value model, or None
        self.updater = Updater(policy.module, self.settings, optimizer_config,
                               allowed_table=None if self.constraint is None else self.constraint.allowed,
                               reference=self.reference, critic=self.critic)
        self.optimizer, self.lr_fn = self.updater.optimizer, self.updater.lr_fn
        self.vocab_size = int(policy.config.text.vocab_size)
        self.reads = BufferReads(buffer, config.env.group_size)   # its `losses`: running totals (metrics)
        self.dropped_invalid_episodes = 0
        self.skipped_batches = 0
        self.skipped_updates = 0              # minibatch updates the in-jit guard skipped (running total)
        self._skipped_in_a_row = 0
        c = config.checkpoint
        self.checkpointer = Checkpointer(f"{workdir}/checkpoints", keep=c.keep, keep_best=c.keep_best,
                                         best_metric=c.best_metric, async_save=c.async_save)
        self.state, self._resume = starting_state(config, self.checkpointer, policy, self.optimizer,
                                                  critic=self.critic, mesh=mesh)
        self.versions = run_history(workdir, self.state.version, buffer, self._resume["cursor"],   # never reused
                                    rl_config.max_offpolicyness(config))
        self.gatherer = BatchGatherer(consumer_batch_size=t.consumer_batch_size,
                                      max_head_offpolicyness=rl_config.max_offpolicyness(config),
                                      dynamic_sampling=t.dynamic_sampling, lost_versions=self.versions.holds_lost)
        self.ledger = ReadLedger(self._resume["cursor"], self._resume["consumed"])
        writer = MetricsWriter if distributed.is_primary() else NullMetrics   # process 0 alone writes files
        self.metrics = writer(workdir, total_steps=t.max_steps, tensorboard=config.metrics.tensorboard,
                              wandb_project=config.metrics.wandb_project, wandb_entity=config.metrics.wandb_entity,
                              progress_bar=config.metrics.progress_bar, config=config.to_dict(),
                              start_step=self.state.step)
        self._t0 = time.monotonic()
        self._idle_s = 0.0
        self._first_episodes_said = False
        self._config_json = run_config.as_dict(config)   # in every checkpoint's meta: the config that trained it
        self._trained_trajectories = 0
        totals.go_on_from(self, self._resume["totals"])   # a resume's running totals go on from its checkpoint's
        self._seen_mark = (self.gatherer.counts.episodes_seen, self.gatherer.counts.successes_seen)   # last step's
        self._success_streak = 0              # steps in a row at train.stop_at_success
        self.trained_episode_ids: list[int] = []   # this process's, in training order
        self._admission = (getattr(self.sink, "set_admission", None)
                           if config.rollout.admission_control else None)
        self._publish(self.state.params)

    # ------------------------------------------------------------------ state
    def save(self, metrics: dict | None = None) -> None:
        pending = self.gatherer.pending_episodes() + list(self._held or ())   # a held batch: read again too
        point = self.ledger.resume_point({e.episode_id for e in pending})
        meta = {"policy_version": self.state.version, "buffer_cursor": point["cursor"],
                "consumed_episode_ids": point["consumed"], "config": self._config_json,
                "running_totals": totals.at_resume_point(self, point["losses_read_again"], pending)}
        self.checkpointer.save(self.state.step, params=self.state.params, opt_state=self.state.opt_state,
                               rng=self.state.rng, meta=meta, metrics=metrics,
                               critic=None if self.critic is None else self.critic.state)

    # ------------------------------------------------------------------ loop
    def poll(self) -> None:
        """Read newly committed whole groups from the buffer into the gatherer; count what the read lost."""
        before = self.ledger.cursor
        result = self.reads.read(before)
        if result is None:   # the store failed for now: the same cursor is read again at the next poll
            return
        self.gatherer.add_groups(self.ledger.record(before, result.cursor, result.groups, losses_of(result)))
        self._publish_admission()

    def _publish(self, params) -> None:
        """Hand a copy of `params` (the update donates its own buffers) to the policy server as the current version,
        in the serving dtype (`rollout.serve_dtype`, by default the compute dtype: a bf16 copy of fp32 master
        weights, `models/serving_weights.py`; the master stays here); the greedy check reads the same copy. A LoRA
        run publishes the merged weights (`models/lora.merge_params`: the server decodes `policy.merged_policy`'s
        adapter-free model)."""
        dtype = serving_dtype(self.config.rollout.serve_dtype, self.policy.config)
        self._published = serving_copy(lora.merge_params(params, self.policy.config.lora), dtype)
        self.versions.publish(self.state.version)   # recorded first: a crash after this never reuses it
        self.sink.set_weights(self._published, self.state.version)

    def _publish_admission(self) -> None:
        """Tell the policy server how much rollout the trainer can use (AReaL's rollout capacity;
        rollout/admission.py): (η + 1) batches in flight or waiting, η = 0 in synchronous mode, and never fewer than
        one group for every worker, so no worker sits idle while the batch is still being played."""
        if self._admission is not None:
            c = self.config
            capacity = max((rl_config.max_offpolicyness(c) + 1) * c.train.consumer_batch_size,
                           c.rollout.num_workers * c.env.group_size)
            self._admission(capacity, self.gatherer.ready_trajectories())

    def next_batch(self, stop: Callable[[], bool]) -> list[dict] | None:
        """Block (polling) until a batch is ready or `stop()`; idle time is counted. With several processes each
        polls the shared buffer and they go on together, once every one has the (same, FIFO) batch."""
        start = time.monotonic()
        said = start
        try:
            while not stop():
                self.poll()
                self._say_first_episodes()
                stops = self.config.train
                cannot = (self.gatherer.unusable_run(int(stops.stop_after_unusable_episodes))
                          or self.gatherer.uniform_run(int(stops.stop_after_uniform_groups)))
                if cannot:
                    raise CannotTrain(f"{cannot}; stopped at train step {self.state.step}")
                if self._held is None:
                    self._held = self.gatherer.pop_batch(self.state.version)
                if distributed.all_processes(self._held is not None):
                    batch, self._held = self._held, None
                    return batch
                if time.monotonic() - said >= console.HEARTBEAT_S:
                    said = time.monotonic()
                    self._say_waiting(said - start)
                time.sleep(self.config.train.idle_sleep_s)
            return None
        finally:
            self._idle_s += time.monotonic() - start

    def _say_first_episodes(self) -> None:
        if not self._first_episodes_said and self.gatherer.counts.episodes_seen:
            self._first_episodes_said = True
            console.log.info("first episodes arrived: %d read from the buffer %s after the trainer started",
                             self.gatherer.counts.episodes_seen, console.duration(time.monotonic() - self._t0))

    def _say_waiting(self, waited_s: float) -> None:
        c = self.gatherer.counts
        console.log.info("waiting for episodes: %d/%d trajectories ready for step %d (%s so far; read %d, dropped "
                         "%d uniform groups, %d stale, %d env-failed, %d cut)", self.gatherer.ready_trajectories(),
                         self.config.train.consumer_batch_size, self.state.step + 1, console.duration(waited_s),
                         c.episodes_seen, c.dropped_uniform_groups, c.dropped_stale, c.env_failed, c.cut_episodes)

    def train_step(self, episodes: list[Episode], should_stop=None) -> tuple[dict, dict] | None:
        """One optimizer step on `episodes`; publishes version v+1; returns the step's (scalars, histograms), or
        None when the batch was skipped (no usable episode, an image gone, or a non-finite update rolled back)."""
        episodes = self._in_vocabulary(episodes)
        if not episodes:
            return None
        sync = self.config.rollout.mode == "sync"
        if sync and hasattr(self.sink, "pause"):
            self.sink.pause()
        try:
            lags = [staleness(e, self.state.version) for e in episodes]
            try:
                batch = assemble(episodes, screenshots=self.buffer.screenshots,   # rows split over data x fsdp
                                 image_processor=self.policy.processor.image_processor,
                                 n_minibatches=self.settings.n_minibatches, constraint=self.constraint,
                                 max_seq_len=self.config.buffer.max_seq_len, row_multiple=batch_divisor(self.mesh))
            except ScreenshotOverwritten as err:   # also ScreenshotCorrupt
                return self._skip(episodes, f"an image of the batch is unavailable: {err}")
            lr = float(self.lr_fn(self.state.step * self.settings.n_minibatches * self.settings.n_epochs))
            # The update donates the live state (an interrupted one leaves nothing to resume from but the last
            # checkpoint); with train.rollback_non_finite its jitted guard skips every non-finite minibatch update.
            with self._mesh_context():   # activation sharding hints (parallel.mesh.constrain_batch) see the mesh
                params, opt_state, stats = self.updater(self.state.params, self.state.opt_state, batch, should_stop)
            skipped = stats.get("skipped_updates", 0)
            self.skipped_updates += skipped
            if skipped and skipped == stats["optimizer_updates"]:   # every update skipped: the weights are unchanged
                self.state.params, self.state.opt_state = params, opt_state
                problem = _non_finite(stats, None) or "a non-finite loss or gradient norm"
                return self._skip(episodes, f"{problem} in every minibatch update: the jitted update skipped them "
                                  f"(rolled back in place), nothing published")
            if skipped:
                log.warning("train step %d: %d of %d minibatch updates had a non-finite loss or gradient norm and "
                            "were skipped in the jitted update; the others trained", self.state.step + 1, skipped,
                            stats["optimizer_updates"])
            problem = _non_finite(stats, params)
            if problem:
                fix = ("set --config.train.rollback_non_finite=True (the in-jit guard) or lower train.lr"
                       if not self._rollback else "lower train.lr")
                raise TrainingDiverged(
                    f"train step {self.state.step + 1}: {problem}; nothing was published and no checkpoint holds "
                    f"it (train.rollback_non_finite={self._rollback}): {fix} (now {self.config.train.lr}), then "
                    f"rerun to resume from the last checkpoint")
            self._skipped_in_a_row = 0
            self.state.params, self.state.opt_state = params, opt_state
            self.state.step += 1
            self.state.version = self.versions.next_after(self.state.version)
            self.state.rng = jax.random.fold_in(self.state.rng, self.state.step)
            self._publish(params)
            self._publish_admission()
        finally:
            if sync and hasattr(self.sink, "resume"):
                self.sink.resume()
        self._trained_trajectories += len(episodes)
        self.trained_episode_ids.extend(e.episode_id for e in episodes)
        return self._step_metrics(episodes, batch, stats, lags, lr)

    def _mesh_context(self):
        """`jax.set_mesh(self.mesh)` (thread-local: the policy server's thread is unaffected), or nothing on one
        device. The update's activations then stay split over the batch axes, as in the AOT compile report."""
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def _in_vocabulary(self, episodes: list[Episode]) -> list[Episode]:
        """`episodes` without those holding token ids outside [0, vocab_size) (they would gather NaN logits in
        jit); the dropped ones are counted and logged."""
        kept, dropped = [], []
        for episode in episodes:
            ids = np.concatenate([step.input_ids for step in episode.steps])
            (kept if ids.min() >= 0 and ids.max() < self.vocab_size else dropped).append(episode)
        if dropped:
            self.dropped_invalid_episodes += len(dropped)
            log.warning("dropped %d episodes whose token ids lie outside the policy's vocabulary of %d (episode ids "
                        "%s): a different tokenizer or a damaged sequence wrote them", len(dropped), self.vocab_size,
                        [e.episode_id for e in dropped][:8])
        return kept

    def _skip(self, episodes: list[Episode], reason: str) -> None:
        """Skip a batch: count it, log and record it (its episodes are consumed: the ledger moves past them)."""
        ids = [e.episode_id for e in episodes]
        self.skipped_batches += 1
        self._skipped_in_a_row += 1
        log.warning("train step %d skipped (%s); its %d episodes are dropped (ids %s%s), weights stay at version %d",
                    self.state.step + 1, reason, len(ids), ids[:8], "..." if len(ids) > 8 else "",
                    self.state.version)
        self.metrics.write_skipped(self.state.step + 1, ids, reason)
        if self._skipped_in_a_row >= MAX_SKIPPED_IN_A_ROW:
            raise TrainingDiverged(
                f"{self._skipped_in_a_row} train steps in a row were skipped at step {self.state.step + 1} (last: "
                f"{reason}); the weights are the finite ones of step {self.state.step}: lower train.lr (now "
                f"{self.config.train.lr}) or check the rollout data, then rerun to resume")
        return None

    def run(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Train until `train.max_steps` or `stop()`; returns the number of steps taken in this call. A stop between
        two `checkpoint.save_every_steps` saves (a signal, a failed worker pool) saves the last step first."""
        taken = 0
        saved, scalars = self.state.step, None   # the step the newest checkpoint holds (the start: on disk or 0)
        try:
            while self.state.step < self.config.train.max_steps and not stop():
                self.checkpointer.check()   # a failed background save stops the run now, naming its step
                episodes = self.next_batch(stop)
                if episodes is None:
                    break
                try:
                    if taken == 0:   # the first step of a process compiles the update (minutes at scale)
                        with console.phase(f"train step {self.state.step + 1}: compiling and running the update"):
                            result = self.train_step(episodes, stop)
                    else:
                        result = self.train_step(episodes, stop)
                except UpdateInterrupted:   # the update donated the live state: the last save is what is left
                    log.info("stopped during train step %d: it is discarded (resume from step %d)",
                             self.state.step + 1, saved)
                    saved = self.state.step
                    break
                if result is None:
                    continue
                scalars, histograms = result
                taken += 1
                if self.greedy_probe is not None:
                    scalars["eval/greedy_success"] = self.greedy_probe(self._published, self.state.version)
                self.metrics.write(self.state.step, scalars, histograms)
                trained = self.trained_episode_ids[-scalars["ppo_actor/trajectories"]:]   # this step's
                self.metrics.write_episodes(self.state.step, trained)
                every = self.config.metrics.sample_episodes_every
                if every and self.state.step % every == 0:
                    self.metrics.write_samples(self.state.step, episodes, self.buffer.screenshots.get,
                                               self.config.metrics.sample_episodes)
                reached = self._success_target_reached(scalars)
                if self.state.step % self.config.checkpoint.save_every_steps == 0 or \
                        self.state.step >= self.config.train.max_steps or reached:
                    self.save(scalars)
                    saved = self.state.step
                if reached:
                    log.info("step %d: %s; stopping", self.state.step, reached)
                    break
            if self.state.step > saved:
                self.save(scalars)
        finally:
            if self.state.step == 0 and self.gatherer.counts.episodes_seen:   # what it saw, though it never trained
                self._write_stopped(sys.exc_info()[1])
            self.close()
        return taken

    def _write_stopped(self, err: BaseException | None) -> None:
        """metrics.jsonl's record of a run that stops before train step 1 (its counts; `err`, what stopped it)."""
        try:
            self.metrics.write_stopped(0, {**self.gatherer.counts_with_queued().as_metrics(),
                                           **{f"buffer/{k}": n for k, n in self.reads.losses.items()}},
                                       one_line(err, 1000) if err else "stopped before train step 1")
        except OSError as write_err:   # a full disk must not hide what stopped the run
            log.warning("metrics.jsonl: the stopped run's counts not written: %s", one_line(write_err))

    def _success_target_reached(self, scalars: dict) -> str:
        """Why the run stops at this step ("" when it goes on): the second step in a row whose
        rollout/success_rate_seen >= train.stop_at_success, or an eval/greedy_success >= train.stop_at_greedy_success
        (the greedy check runs on the primary process only; every process stops with it)."""
        t = self.config.train
        target = t.stop_at_success
        seen = scalars.get("rollout/success_rate_seen", float("nan"))
        hit = target is not None and seen == seen and seen >= target
        self._success_streak = self._success_streak + 1 if hit else 0
        if self._success_streak >= 2:
            return f"success of the episodes read reached train.stop_at_success={target:g} on two steps in a row"
        greedy_target = t.stop_at_greedy_success
        if greedy_target is not None:
            greedy = scalars.get("eval/greedy_success", float("nan"))
            if distributed.any_process(greedy == greedy and greedy >= greedy_target):
                return (f"the greedy policy's success on the held-out check reached "
                        f"train.stop_at_greedy_success={greedy_target:g}")
        return ""

    def close(self) -> None:
        try:
            self.checkpointer.close()
        finally:
            self.metrics.close()

    # ------------------------------------------------------------------ metrics
    def _seen_success_rate(self, counts) -> float:
        """Success rate of the episodes read since the previous call (NaN when none were)."""
        seen, won = counts.episodes_seen, counts.successes_seen
        last_seen, last_won = self._seen_mark
        self._seen_mark = (seen, won)
        return (won - last_won) / (seen - last_seen) if seen > last_seen else float("nan")

    def _step_metrics(self, episodes, batch, stats, lags, lr):
        rewards = np.array([e.reward for e in episodes])
        steps = np.array([e.num_steps for e in episodes])
        success = rewards > 0
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        counts = self.gatherer.counts
        rollout = self.rollout_stats()
        loss_stats = {k.split("/", 1)[1]: v for k, v in stats.items() if k.startswith("loss_stats/")}
        scalars = {
            "rollout/reward": float(rewards.mean()),
            "rollout/success_rate": float(success.mean()),
            "rollout/steps_success/avg": float(steps[success].mean()) if success.any() else float("nan"),
            "rollout/steps_failure/avg": float(steps[~success].mean()) if (~success).any() else float("nan"),
            **memory_metrics(episodes, success),
            **counts.as_metrics(),
            **{f"buffer/{k}": n for k, n in self.reads.losses.items()},
            "trainer/dropped_invalid_episodes": self.dropped_invalid_episodes,
            "trainer/skipped_batches": self.skipped_batches,
            "trainer/skipped_updates": self.skipped_updates,
            # every episode read since the last step, before dynamic sampling (which keeps the batch near 50%)
            "rollout/success_rate_seen": self._seen_success_rate(counts),
            "rollout/staleness/mean": float(np.mean(lags)),
            "rollout/staleness/max": float(np.max(lags)),
            "ppo_actor/final_reward/avg": stats["final_reward"],
            "ppo_actor/advantages/avg": stats["advantages"],
            "ppo_actor/update/actor_loss/avg": stats["actor_loss"],
            "ppo_actor/update/approx_kl_abs/avg": stats["approx_kl_abs"],
            "ppo_actor/update/behave_approx_kl_abs/avg": stats["behave_approx_kl_abs"],
            "ppo_actor/behave_cap_ratio": loss_stats.get("behave_cap_ratio", 0.0),
            "ppo_actor/update/clip_ratio/avg": loss_stats.get("clip_ratio", 0.0),
            "ppo_actor/update/dual_clip_ratio/avg": loss_stats.get("dual_clip_ratio", 0.0),
            "ppo_actor/update/grad_norm": stats["grad_norm"],
            **({"ppo_actor/ref_kl": stats["ref_kl"]} if "ref_kl" in stats else {}),
            "ppo_actor/update/lr": lr,
            "ppo_actor/update/policy_tokens": stats["policy_tokens"],
            "ppo_actor/rows": batch.num_real_rows,
            "ppo_actor/trajectories": len(episodes),
            "throughput/trajectories_per_hour": self._trained_trajectories / elapsed * 3600.0,
            "throughput/tokens_per_s": float(rollout.get("generated_tokens", 0)) / elapsed,
            "trainer/idle_fraction": self._idle_s / elapsed,
            "rollout/admission_wait_s": float(rollout.get("admission_wait_s", 0.0)),
            "policy/version": self.state.version,
        }
        lags = np.asarray(lags)
        top = min(self.config.rollout.max_head_offpolicyness, 4)
        for k in range(top + 1):
            scalars[f"rollout/staleness/hist_{k}"] = int(np.sum(lags == k))
        if top < self.config.rollout.max_head_offpolicyness:
            scalars[f"rollout/staleness/hist_gt{top}"] = int(np.sum(lags > top))
        for key, value in loss_stats.items():
            scalars.setdefault(f"ppo_actor/update/{key}/avg", value)
        scalars.update({f"ppo_critic/{k.split('/', 1)[1]}": v for k, v in stats.items() if k.startswith("critic/")})
        return scalars, {"rollout/staleness": lags.tolist(), "rollout/steps": steps.tolist()}


@jax.jit
def _all_finite(tree) -> jax.Array:
    """Scalar bool: every floating-point leaf of `tree` is free of NaN and inf."""
    leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _non_finite(stats: dict, params) -> str | None:
    """What is not finite after an update (loss, gradient norm, weights unless None), or None when all of it is."""
    for key, name in (("actor_loss", "actor loss"), ("grad_norm", "gradient norm")):
        if not np.isfinite(stats[key]):
            return f"{name} is {stats[key]}"
    if params is not None and not bool(_all_finite(params)):
        return "the updated weights hold NaN/inf"
    return None

