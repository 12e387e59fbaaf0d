"""Start, supervise and stop a training run: ring buffer, policy server, rollout worker pool, trainer.

    run(config, workdir)   # what launch/train.py calls after the config validated

One process holds the trainer and the policy server (they share the device(s); the server decodes on its own
thread between the trainer's updates and gets each new version in memory). Rollout workers are separate
processes (Chromium per worker) supervised by `jaxwebrl.rollout.pool.WorkerPool`, which replaces a worker that
dies. SIGINT/SIGTERM, `train.max_steps` or a fatal error end the run the same way: trainer stops and saves,
workers and their browsers are terminated, the server closes; no child process outlives `run`.

Multi-host (`config.distributed`, docs/scaling.md): `run` is called once per process with the same config. The
processes join one JAX job first; every one builds the same trainer on one mesh spanning them all, reads the same
buffer and runs the same updates, and they agree on when to stop. Process 0 alone runs the policy server (on a
gathered copy of the weights, `parallel/multihost.py`), the transport, the worker pool and the metrics files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Callable

import jax

from jaxwebrl.buffer import from_config as run_buffer
from jaxwebrl.buffer.owner import trainer_lock
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.errors import RolloutFailed, RunError, one_line
from jaxwebrl.models.attention_kernels import config_kernel
from jaxwebrl.models.policy import merged_policy
from jaxwebrl.models.serving_weights import serving_copy, serving_dtype
from jaxwebrl.parallel import distributed, multihost
from jaxwebrl.rollout.budget import check_first_step_fits
from jaxwebrl.rollout.ray_launcher import pool_for
from jaxwebrl.rollout.serving import PolicyService
from jaxwebrl.rollout.spec import run_fingerprint, worker_spec
from jaxwebrl.train import console, run_config
from jaxwebrl.train.host_limits import map_limit_warning
from jaxwebrl.train.trainer import Trainer
from jaxwebrl.train.workdir import RUN_UMASK, check_workdir, remove_unused_workdir, workdir_lock

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event):
    """SIGINT/SIGTERM set `stop` (the loop then ends cleanly); a second Ctrl-C raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        log.warning("signal %d: stopping (saving, closing workers and browsers)", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(config, workdir: str, *, stop: threading.Event | None = None, allow_config_change: bool = False,
        greedy_probe: Callable[..., Any] | None = None) -> int:
    """Train until `train.max_steps`, a signal, or `stop` is set; returns a process exit code. WORKDIR/config.json
    records the config; a resume whose config differs is refused unless `allow_config_change` (run_config.py).

    `greedy_probe`: the factory `(config, policy, num_seeds=n) -> probe` of `train.stop_at_greedy_success`'s check
    (`jaxwebrl.eval.probe.SuccessProbe`, which launch/train.py passes: evaluation sits beside training in the
    layers, not below it, so the launcher composes the two)."""
    if config.train.get("stop_at_greedy_success") is not None and greedy_probe is None:
        raise RunError("train.stop_at_greedy_success is set but this caller gave no greedy check: run "
                       "launch/train.py, or pass supervisor.run(..., greedy_probe=jaxwebrl.eval.probe.SuccessProbe)")
    console.log_to_stderr()
    new_workdir = not os.path.exists(workdir)
    check_workdir(workdir)   # before any JAX or browser work: a read-only or foreign workdir is one line
    distributed.initialize(multihost.initialize_settings(config.get("distributed")))  # before JAX work
    stop = stop or threading.Event()
    primary = distributed.is_primary()
    previous_umask = os.umask(RUN_UMASK)   # inherited by the worker processes and their browsers
    try:
        with workdir_lock(workdir) if primary else contextlib.nullcontext(), \
                trainer_lock(run_buffer.path_for(config, workdir)) if primary else contextlib.nullcontext():
            if primary:
                changes = run_config.record(config, workdir, allow_change=allow_config_change)
                log.info("config validated (%s); workdir %s%s", config.get("variant") or "recipe", workdir,
                         f", resuming with changes {run_config.describe(changes)}" if changes else "")
                if (limit := map_limit_warning()) is not None:
                    log.warning("%s", limit)
            return _run(config, workdir, stop, primary, greedy_probe)
    except RunError:
        if new_workdir and primary:   # refused before it wrote anything (another run's buffer): leave no trace
            remove_unused_workdir(workdir)
        raise
    finally:
        os.umask(previous_umask)


class _MeshProbe:
    """A SuccessProbe fed params that live on the trainer's mesh, copied whole onto the server's device."""

    def __init__(self, probe, device: jax.Device):
        self.probe, self.device = probe, device

    def __call__(self, params, version: int) -> float:
        return self.probe(distributed.whole_on_device(params, self.device), version)

    def close(self) -> None:
        self.probe.close()


def _greedy_probe(config, policy, layout, factory):
    """The greedy check of `train.stop_at_greedy_success` (`factory`: eval/probe.py's SuccessProbe), on one process
    only."""
    if jax.process_count() > 1:
        raise RunError("train.stop_at_greedy_success runs its greedy check in one process; this run has "
                       f"{jax.process_count()}: unset it and evaluate the checkpoints with launch/eval.py")
    probe = factory(config, policy, num_seeds=config.train.greedy_check_seeds)
    # on a mesh `policy` is already the whole serving copy (`_served_policy`): the check's warm-up compiles for the
    # weights every check then passes, whole on the server's device
    return probe if layout.mesh is None else _MeshProbe(probe, layout.server_device)


def _served_policy(config, policy, layout, primary: bool):
    """What process 0's policy server (and the greedy check) start from: the adapter-free policy (LoRA:
    `merged_policy`). On a trainer mesh, its whole serving copy on the server's device, made as the trainer's
    publish makes it: cast on the mesh, shard by shard, then gathered on the devices (a collective every process
    joins; None on the others). Cast by process 0 alone, the mesh's global arrays would run a program on devices
    that only the other processes drive. The trainer's first publish replaces it before any episode is played."""
    served = merged_policy(policy)
    if layout.mesh is None:
        return served
    copy = serving_copy(served.params, serving_dtype(config.rollout.serve_dtype, served.config))
    whole = distributed.whole_on_device(copy, layout.server_device if primary else None)
    return served.replace_params(whole) if primary else None


def _run(config, workdir: str, stop: threading.Event, primary: bool, greedy_probe) -> int:
    layout = multihost.layout(config)
    if layout.mesh is not None:
        log.info("process %d of %d: %d local of %d devices; trainer mesh %s", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count(), dict(layout.mesh.shape))
    # the processes meet while in step: after a multi-process program (the recipe's init on the mesh, whose compile
    # takes each process its own time), a first collective reached > 30 s apart fails (gloo's rendezvous, on CPU)
    distributed.sync("processes joined")
    with console.phase(f"building the policy (model.name={config.model.name})"):
        # on a trainer mesh each param is made or read onto its shards, never whole on one device; the trainer
        # starts it from a checkpoint or a warm start (resume.py)
        policy = recipe_policy(config, mesh=layout.mesh)
    log.info("attention kernel: %s (model.attention_impl=%r on the %s backend)", config_kernel(policy.config),
             policy.config.attention_impl, jax.default_backend())
    check_first_step_fits(config, policy.processor)   # before any browser: a run whose first step cannot fit stops
    vocab_size = policy.config.text.vocab_size
    # process 0 creates the buffer, the others open it once it exists
    with console.phase(f"opening the ring buffer {run_buffer.path_for(config, workdir)}"):
        buffer = run_buffer.open_or_create(config, workdir, vocab_size) if primary else None
    distributed.sync("buffer ready")
    if buffer is None:
        buffer = RingBuffer.open(run_buffer.path_for(config, workdir))
    served = _served_policy(config, policy, layout, primary)   # the trainer publishes merged weights too
    service = (PolicyService.for_policy(served, buffer, config, host=config.rollout.host,
                                        num_clients=config.rollout.num_workers,
                                        curve=config.rollout.get("curve", False)) if primary else None)
    server = service.server if service is not None else None
    sink = server if layout.mesh is None else multihost.MeshWeightSink(server, layout.server_device)
    pool = None
    failure: list[BaseException] = []
    with _stop_on_signals(stop), contextlib.ExitStack() as cleanup:
        if service is not None:
            cleanup.callback(service.close)
        reads = multihost.LockstepBuffer(buffer) if jax.process_count() > 1 else buffer   # same episodes everywhere
        probe = None
        if config.train.get("stop_at_greedy_success") is not None:
            with console.phase(f"starting the greedy check ({config.train.greedy_check_seeds} held-out instances "
                               "a task, after every step)"):
                probe = _greedy_probe(config, served, layout, greedy_probe)
                cleanup.callback(probe.close)
        with console.phase("building the trainer (optimizer state, checkpoint restore)"):
            trainer = Trainer(config, workdir, policy=policy, buffer=reads, weight_sink=sink,
                              rollout_stats=server.stats if server is not None else None, mesh=layout.mesh,
                              greedy_probe=probe)
        if trainer.state.step >= config.train.max_steps:
            log.info("workdir %s already holds %d steps (train.max_steps=%d): nothing to do",
                     workdir, trainer.state.step, config.train.max_steps)
            trainer.close()
            return 0
        if primary:
            service.start()
            log.info("policy server up at %s (policy version %d)", service.address, trainer.state.version)
            # WORKDIR/transport.json + transport.token: launch/rollout.py --workdir joins if its fingerprint matches
            service.publish(workdir, run_fingerprint(config), range(config.rollout.num_workers))   # pool_for's ids
            spec = worker_spec(config, buffer_path=run_buffer.path_for(config, workdir), address=service.address,
                               token=service.token, stats_dir=os.path.join(workdir, "rollout_stats"),
                               server_key=service.server_key, committed=buffer.latest_cursor()["next"])
            pool = pool_for(config, spec).start()   # local processes or Ray actors, by rollout.launcher
            cleanup.callback(pool.close)
            log.info("%d rollout workers started (%s launcher, seed %d, env.tasks=%s); waiting for their first "
                     "episodes", config.rollout.num_workers, config.rollout.launcher, spec["worker"]["seed"],
                     config.env.tasks)

        def should_stop() -> bool:
            """Every process stops at the same point: when any of them has a signal, `stop` or a failed pool."""
            if pool is not None and not failure:
                try:
                    pool.raise_if_failed()
                    service.raise_if_failed()   # a dead server thread stops the run, never stalls it
                except Exception as err:  # noqa: BLE001 - re-raised below, once every process has stopped
                    failure.append(err)
            return distributed.any_process(stop.is_set() or bool(failure))

        trainer.run(should_stop)
        log.info("stopped at step %d (policy version %d); worker restarts: %d",
                 trainer.state.step, trainer.state.version, pool.restarts if pool is not None else 0)
    if failure:
        raise RolloutFailed(f"{one_line(failure[0], 600)}; the trainer stopped at step {trainer.state.step}: fix the "
                            "cause, then rerun the same command to resume from the last checkpoint") from failure[0]
    return 0
