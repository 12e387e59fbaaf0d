"""What runs inside one rollout worker process (or Ray actor, or hand-started node): a worker built from the pool's
JSON spec, serving until it is told to stop, its failure reported in one line.

    worker, client = build_worker(spec, worker_id)           # the one way a spec becomes a RolloutWorker
    serve_worker(spec, worker_id, report_path=PATH)           # play until SIGTERM; exit codes below
    worker_process_main(spec_json, worker_id, ...)            # WorkerPool's process target: own group, dies with it

Exit codes: EXIT_FATAL (a bad configuration, a refused token, a buffer that keeps refusing episodes, a task whose
own page or spec fails before its first step, a first step longer than the buffer's rows: restarting cannot help) and EXIT_CRASH (anything else: the pool
restarts it unless it keeps failing the same way). Either way the error goes to the report file as one line first,
for the pool to quote; only an unexpected error is logged with its traceback. Its envs are closed for at most
WORKER_EXIT_S before it exits with that code, as after SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env.browser.chromium import set_parent_death_signal
from jaxwebrl.errors import CannotTrain, one_line
from jaxwebrl.files import write_file_atomically
from jaxwebrl.extensions import import_extensions
from jaxwebrl.rollout.client import InProcessClient, PolicyClient
from jaxwebrl.rollout.engine_judge import link_engine_judge   # also registers the engine judge with make_judge
from jaxwebrl.rollout.scripted import ScriptedBackend
from jaxwebrl.rollout.wire import TransportAuthError, TransportRequestRefused
from jaxwebrl.rollout.worker import BufferUnusable, EnvGivenUp, RolloutWorker, WorkerConfig

EXIT_FATAL = 78  # configuration or authentication error: restarting would not help
EXIT_CRASH = 1   # an unexpected error: restarted, unless it keeps being the same one
WORKER_EXIT_S = 15  # after SIGTERM a worker is gone within this, even when no pool is left to SIGKILL it
FATAL_ERRORS = (TransportAuthError, TransportRequestRefused, BufferUnusable, CannotTrain)   # and a task's EnvGivenUp

log = logging.getLogger(__name__)


def build_worker(spec: dict[str, Any], worker_id: int, incarnation: int = 0):
    """(RolloutWorker, client) from a pool spec, in this process; also used by Ray actors and launch/rollout.py.
    The spec's extension modules are imported first (they may register the envs its tasks name); an engine judge
    gets the spec's policy connection."""
    import_extensions(spec.get("extensions"))
    worker = link_engine_judge(spec["worker"], spec["policy"])
    config = WorkerConfig.from_dict(dict(worker, seed=int(worker.get("seed", 0)) * 1000003 + incarnation))
    buffer = RingBuffer.open(spec["buffer"]["path"])
    policy = dict(spec["policy"])
    kind = policy.pop("kind")
    if kind == "remote":
        client = PolicyClient(policy["address"], token=policy["token"], timeout_s=policy.get("timeout_s", 600.0),
                              server_key=policy.get("server_key"))
    else:
        client = InProcessClient(ScriptedBackend.from_config(policy, fetch_image=buffer.screenshots.get))
    return RolloutWorker(config, client, buffer, worker_id=worker_id), client


def worker_process_main(spec_json: str, worker_id: int, incarnation: int, parent_pid: int,
                        report_path: str | None = None) -> None:
    """Entry point of a worker process: own process group, die with the parent, close browsers on SIGTERM."""
    os.setsid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(0)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s worker-{worker_id} %(levelname)s %(name)s: %(message)s")

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.alarm(WORKER_EXIT_S)   # a cleanup that hangs is ended by SIGALRM's default action (the
        raise SystemExit(0)           # browsers follow: chromedriver dies with its thread, Chromium with it)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    serve_worker(json.loads(spec_json), worker_id, incarnation, report_path=report_path)


def serve_worker(spec: dict[str, Any], worker_id: int, incarnation: int = 0, report_path: str | None = None) -> None:
    """Run one worker of a pool spec in this process until SIGTERM/SystemExit (also for hand-started workers,
    e.g. launch/rollout.py on a remote node). Exits with EXIT_FATAL on a bad configuration, a refused token or a
    buffer that keeps refusing its episodes (disk full), with EXIT_CRASH on any other error; either way the error
    goes to `report_path` as one line first."""
    worker = client = None
    apply_placement(spec.get("placement"))

    def stop(code: int, exc: BaseException, what: str, traceback: bool = False) -> None:
        line = one_line(exc, limit=1000)
        log.error("worker %d %s: %s", worker_id, what, line, exc_info=traceback)
        write_report(report_path, line)
        close_within(WORKER_EXIT_S, worker, client)
        os._exit(code)

    try:
        try:
            worker, client = build_worker(spec, worker_id, incarnation)
        except (ValueError, OSError) as exc:  # bad configuration, missing buffer or extension: restarting cannot help
            stop(EXIT_FATAL, exc, "cannot start")
        stats_dir = spec.get("stats_dir")
        while True:
            worker.run(max_groups=1)
            if stats_dir:
                try:
                    write_stats(stats_dir, worker_id, incarnation, worker.stats.to_dict())
                except OSError as exc:  # a full disk costs the stats file, not the worker
                    log.warning("worker %d: stats not written: %s", worker_id, exc)
    except FATAL_ERRORS as exc:
        stop(EXIT_FATAL, exc, "stops for good")
    except EnvGivenUp as exc:   # its line names the task and the cause; a fresh browser may help, a fresh task not
        stop(EXIT_FATAL if restart_cannot_help(exc) else EXIT_CRASH, exc, "gives up")
    except Exception as exc:  # noqa: BLE001 - reported in one line; the pool decides whether to restart
        stop(EXIT_CRASH, exc, "failed", traceback=True)
    finally:
        close_quietly(worker, client)


def restart_cannot_help(exc: BaseException) -> bool:
    """Whether `exc` ends a worker for good (EXIT_FATAL; a Ray actor's FatalWorkerError): a refused token or request,
    a buffer that keeps refusing episodes, a first step longer than the buffer's rows, a task whose own page or spec
    fails before its first step."""
    return isinstance(exc, FATAL_ERRORS) or (isinstance(exc, EnvGivenUp) and exc.task_fault)


def apply_placement(placement: dict | None) -> None:
    """This process's CPU placement from the spec (`rollout.worker_nice`, `rollout.worker_cpus`); the browsers it
    starts inherit both. A higher nice value lets the trainer and the policy server take the cores first when they
    share a few with the browsers, and the workers use what is left."""
    placement = placement or {}
    if placement.get("nice"):
        os.nice(int(placement["nice"]))
    if placement.get("cpus"):
        os.sched_setaffinity(0, {int(c) for c in placement["cpus"]})


def write_report(path: str | None, line: str) -> None:
    """Leave the one-line failure at `path` for the pool (atomically; a write that fails is skipped)."""
    if not path:
        return
    try:
        write_file_atomically(path, [line.encode()], fsync=False)
    except OSError:  # the report is a courtesy: the exit code still tells the pool
        pass


def close_within(seconds: float, worker, client) -> None:
    """`close_quietly` on a daemon thread, waited for at most `seconds`: a worker that stops for good exits with its
    own code soon even when an env's close hangs (a wedged browser; EnvHost waits step_timeout_s for each env)."""
    closer = threading.Thread(target=close_quietly, args=(worker, client), name="worker-close", daemon=True)
    closer.start()
    closer.join(seconds)
    if closer.is_alive():
        log.warning("closing the worker's envs took over %g s: exiting without them", seconds)


def close_quietly(worker, client) -> None:
    for thing in (worker, client):
        if thing is not None:
            try:
                thing.close()
            except Exception:  # shutting down: nothing left to protect
                pass


def write_stats(stats_dir: str, worker_id: int, incarnation: int, stats: dict) -> None:
    """The worker's counters as `stats_dir/worker_<id>.json` (replaced atomically after every group)."""
    os.makedirs(stats_dir, exist_ok=True)
    record = dict(stats, worker_id=worker_id, incarnation=incarnation, pid=os.getpid())
    write_file_atomically(os.path.join(stats_dir, f"worker_{worker_id}.json"), [json.dumps(record).encode()],
                          fsync=False)
