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
import errno
import fcntl
import logging
import os
import signal
import threading

from jaxwebrl.train.config_validation import env_specs
from jaxwebrl.train.errors import WorkdirError

RUN_UMASK = 0o077   # files a run creates (checkpoints, buffer, metrics, logs) are 0600, its directories 0700

log = logging.getLogger(__name__)


def buffer_path(config, workdir: str) -> str:
    return config.buffer.path or os.path.join(workdir, "buffer")


def buffer_for(config, workdir: str, vocab_size: int = 0):
    """Open WORKDIR/buffer (or config.buffer.path) when it exists, else create it; `vocab_size` (the policy's)
    makes every writer refuse token ids outside the vocabulary."""
    from jaxwebrl.buffer import RingBuffer

    path = buffer_path(config, workdir)
    if os.path.isfile(os.path.join(path, "buffer.json")):
        return RingBuffer.open(path)
    return RingBuffer.create(path, capacity_steps=config.buffer.capacity_steps, max_seq_len=config.buffer.max_seq_len,
                             screenshot_shape=(config.env.screenshot_height, config.env.screenshot_width, 3),
                             max_images_per_step=config.env.prompt_window + 1, vocab_size=vocab_size)


def build_policy(config):
    """The policy the config names (tiny random Qwen3-VL, a local HF checkpoint, or random weights at a published
    preset's shapes; `models/presets.py`), with the warm-start weights of `model.init_params` when set."""
    from jaxwebrl.eval.policies import with_init_params
    from jaxwebrl.models import presets

    return with_init_params(config, presets.build_policy(config.model, seed=config.seed))


def worker_spec(config, *, buffer_path: str, address: str, token: str, stats_dir: str) -> dict:
    """The JSON spec of the rollout worker pool for this config."""
    e, m = config.env, config.model
    tasks = env_specs(config)
    env_options = {"screenshot_size": [e.screenshot_width, e.screenshot_height]}  # (W, H)
    if "toy" not in tasks:  # the toy env has a fixed horizon of its own
        env_options["max_steps"] = e.max_episode_steps
    prompt = {"window": e.prompt_window, "action_style": e.action_style}
    if e.system_prompt is not None:
        prompt["system_prompt"] = e.system_prompt
    return {
        "worker": {"tasks": tasks, "group_size": e.group_size, "env_options": env_options,
                   "step_timeout_s": e.step_timeout_s, "max_new_tokens": m.max_new_tokens,
                   "temperature": m.temperature, "top_p": m.top_p,
                   "prompt": prompt, "seed": config.seed},
        "policy": {"kind": "remote", "address": address, "token": token},
        "buffer": {"path": buffer_path},
        "stats_dir": stats_dir,
    }


def _log_to_stderr() -> None:
    """jaxwebrl's INFO logs on stderr (absl may own the root logger, so configure our package logger)."""
    package = logging.getLogger("jaxwebrl")
    package.setLevel(logging.INFO)
    if not package.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        package.addHandler(handler)
        package.propagate = False


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


def check_workdir(workdir: str) -> None:
    """Creates WORKDIR (0700) and proves it writable, or raises WorkdirError naming the path and the fix."""
    try:
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(probe)
    except OSError as err:
        where = err.filename or workdir
        if err.errno == errno.EROFS:
            fix = "it is on a read-only filesystem: pass a --workdir on a writable disk (or remount it rw)"
        elif err.errno in (errno.EACCES, errno.EPERM):
            fix = f"this user may not write there: pass another --workdir or fix its permissions (chmod u+w {where})"
        elif err.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "the disk is full: free space or pass a --workdir on another disk"
        else:
            fix = "pass a --workdir this user can create and write"
        raise WorkdirError(f"workdir {workdir} is not writable ({err.strerror or err}: {where}); {fix}") from None


@contextlib.contextmanager
def workdir_lock(workdir: str):
    """Holds an exclusive lock on WORKDIR/train.lock while the block runs: a second run on the same workdir would
    append to the same buffer and write the same checkpoints. The kernel drops the lock when its process dies,
    so a killed run never blocks its own resumption."""
    path = os.path.join(workdir, "train.lock")
    with os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o600), "r+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise WorkdirError(f"workdir {workdir} is in use by another training run (pid {holder}): stop that run "
                               "or pass another --workdir") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run(config, workdir: str, *, stop: threading.Event | None = None) -> int:
    """Train until `train.max_steps`, a signal, or `stop` is set; returns a process exit code."""
    from jaxwebrl.parallel import distributed, multihost

    check_workdir(workdir)   # before any JAX or browser work: a read-only or foreign workdir is one line
    distributed.initialize(multihost.initialize_settings(config.get("distributed")))  # before JAX work
    _log_to_stderr()
    stop = stop or threading.Event()
    primary = distributed.is_primary()
    previous_umask = os.umask(RUN_UMASK)   # inherited by the worker processes and their browsers
    try:
        with workdir_lock(workdir) if primary else contextlib.nullcontext():
            return _run(config, workdir, stop, primary)
    finally:
        os.umask(previous_umask)


def _run(config, workdir: str, stop: threading.Event, primary: bool) -> int:
    import jax

    from jaxwebrl.parallel import distributed, multihost
    from jaxwebrl.rollout.policy_server import PolicyServer
    from jaxwebrl.rollout.ray_launcher import pool_for
    from jaxwebrl.rollout.transport import TransportServer, new_token
    from jaxwebrl.train.trainer import Trainer

    layout = multihost.layout(config)
    if layout.mesh is not None:
        log.info("process %d of %d: %d local of %d devices; trainer mesh %s", jax.process_index(),
                 jax.process_count(), jax.local_device_count(), jax.device_count(), dict(layout.mesh.shape))
    policy = build_policy(config)
    vocab_size = policy.config.text.vocab_size
    buffer = buffer_for(config, workdir, vocab_size) if primary else None   # process 0 creates it, others open it
    distributed.sync("buffer ready")
    if buffer is None:
        from jaxwebrl.buffer import RingBuffer

        buffer = RingBuffer.open(buffer_path(config, workdir))
    server = PolicyServer.from_config(policy, buffer, config) if primary else None
    sink = server if layout.mesh is None else multihost.HostWeightSink(server, layout.server_device)
    token = new_token()
    transport = pool = trainer = None
    failure: list[BaseException] = []
    with _stop_on_signals(stop), contextlib.ExitStack() as cleanup:
        if server is not None:
            cleanup.callback(server.close)
        reads = multihost.LockstepBuffer(buffer) if jax.process_count() > 1 else buffer   # same episodes everywhere
        trainer = Trainer(config, workdir, policy=policy, buffer=reads, weight_sink=sink,
                          rollout_stats=server.stats if server is not None else None, mesh=layout.mesh)
        if trainer.state.step >= config.train.max_steps:
            log.info("workdir %s already holds %d steps (train.max_steps=%d): nothing to do",
                     workdir, trainer.state.step, config.train.max_steps)
            trainer.close()
            return 0
        if primary:
            transport = TransportServer(server.handle, token=token, host=config.rollout.host,
                                        num_threads=max(4, 2 * config.rollout.num_workers)).start()
            cleanup.callback(transport.close)
            spec = worker_spec(config, buffer_path=buffer_path(config, workdir), address=transport.address,
                               token=token, stats_dir=os.path.join(workdir, "rollout_stats"))
            pool = pool_for(config, spec).start()   # local processes or Ray actors, by rollout.launcher
            cleanup.callback(pool.close)

        def should_stop() -> bool:
            """Every process stops at the same point: when any of them has a signal, `stop` or a failed pool."""
            if pool is not None and not failure:
                try:
                    pool.raise_if_failed()
                    transport.raise_if_failed()   # a dead server thread stops the run, never stalls it
                    server.raise_if_failed()
                except Exception as err:  # noqa: BLE001 - re-raised below, once every process has stopped
                    failure.append(err)
            return distributed.any_process(stop.is_set() or bool(failure))

        trainer.run(should_stop)
        log.info("stopped at step %d (policy version %d); worker restarts: %d",
                 trainer.state.step, trainer.state.version, pool.restarts if pool is not None else 0)
    if failure:
        raise failure[0]
    return 0
