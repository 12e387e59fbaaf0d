r"""Start rollout workers by hand on a (remote) CPU node, against a running policy server and a shared buffer.

    export JAXWEBRL_TOKEN=...   # or --token_file=PATH: the policy server's shared token (never on the command line)
    python launch/rollout.py --config=configs/constT10.py:tiny --server=tcp://10.0.0.1:5555 \
        --buffer=/shared/run1/buffer --num_workers=16 --first_worker_id=1000

    python launch/rollout.py --config=configs/constT10.py:tiny --workdir=/shared/run1 --num_workers=16 ...

`--workdir` joins a running training run: its policy server's address, CurveZMQ public key and token come from
WORKDIR/transport.json and WORKDIR/transport.token (mode 0600, written when the run starts), its buffer is the
run's; --server, --token_file/$JAXWEBRL_TOKEN and --buffer override them. The run publishes there what its workers
must agree on (`rollout.spec.run_fingerprint`: variant, group size, screenshot shape, action grammar, vocabulary,
horizon cap); a host whose own config differs is refused in one line naming the keys.

Worker settings (tasks, group size, screenshot size, prompt, sampling) come from the same recipe as the trainer's
(`--config.a.b=v` overrides apply), so both sides agree by construction; `--server` and `--buffer` say where the
policy server and ring buffer are (a path on a shared filesystem or a TensorStore kvstore URL, e.g.
gs://bucket/run1/buffer). Worker ids seed each worker's task draw and key the policy server's admission of new
groups, so no two workers of a run may share one: `--first_worker_id` gives this node's first; left out, the node
takes a random block of ids past the run's own (`ID_BLOCK` apart: two nodes meet with odds of about one in a
million). An explicit range that overlaps the ids the run published for its own workers (WORKDIR/transport.json)
is refused in one line.

`--launcher=local` (default) runs the workers as supervised processes on this node (`WorkerPool`);
`--launcher=ray` places them on a Ray cluster (`--ray_address`, e.g. auto or ray://head:10001). Runs until
SIGINT/SIGTERM, then stops every worker and its browsers. Exits 78 when the workers stop for good (wrong token,
bad configuration) or when nothing has listened at the policy server's address for `--give_up_after_s` (its trainer
is gone: the line names the address), 1 on a bad flag (one `rollout error:` line). It logs what it does on stderr.
"""

import logging
import os
import secrets
import signal
import socket
import threading
import time
import urllib.parse

from absl import app, flags

from jaxwebrl import cli
from jaxwebrl.buffer.from_config import path_for
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.rollout.pool import WorkerPool
from jaxwebrl.rollout.published import read_published
from jaxwebrl.rollout.ray_launcher import RayWorkerPool
from jaxwebrl.rollout.spec import mismatched_keys, run_fingerprint, worker_spec
from jaxwebrl.rollout.transport import curve_key
from jaxwebrl.rollout.worker_process import EXIT_FATAL
from jaxwebrl.train import console

_SERVER = flags.DEFINE_string("server", None, "policy server transport address, e.g. tcp://10.0.0.1:5555")
_TOKEN_FILE = flags.DEFINE_string("token_file", None, "file holding the shared token (default: $JAXWEBRL_TOKEN)")
_BUFFER = flags.DEFINE_string("buffer", None, "ring buffer path or kvstore URL (default: the config's buffer.path)")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "workers on this node (default: rollout.num_workers)")
_FIRST_ID = flags.DEFINE_integer("first_worker_id", None, "id of this node's first worker, distinct per node "
                                 "(default: a random block past the run's own workers' ids)")
_STATS_DIR = flags.DEFINE_string("stats_dir", None, "each worker writes worker_<id>.json here after every group")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", ["local", "ray"], "processes on this node, or Ray actors")
_WORKDIR = flags.DEFINE_string("workdir", None, "a running training run's workdir: join its published policy server")
_SERVER_KEY = flags.DEFINE_string("server_key", None, "the policy server's CurveZMQ public key (rollout.curve runs)")
_RAY_ADDRESS = flags.DEFINE_string("ray_address", None, "Ray cluster address for --launcher=ray (e.g. auto)")
_GIVE_UP_S = flags.DEFINE_float("give_up_after_s", 300.0, "stop when nothing has listened at the policy server's "
                                "address for this long (its trainer is gone); 0: wait for ever")
PROBE_EVERY_S = 5.0   # how often the policy server's address is probed
ID_BLOCK = 1024       # a node's default ids start at a random multiple of this past the run's own
ID_BLOCKS = 1 << 20   # ... out of this many blocks

log = logging.getLogger("jaxwebrl.launch.rollout")


class ServerWatch:
    """Whether anything listens at a tcp://host:port address (a TCP connect: the trainer's policy server, or
    nothing once its process is gone), and for how long nothing has."""

    def __init__(self, address: str, clock=time.monotonic):
        parts = urllib.parse.urlsplit(address)
        self.address, self.host, self.port = address, parts.hostname, parts.port
        self.clock = clock
        self.gone_since: float | None = None

    def listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=PROBE_EVERY_S):
                return True
        except OSError:
            return False

    def silent_for(self) -> float:
        """Seconds since the first of the probes in a row that found nothing listening (0 while one does)."""
        if self.listening():
            self.gone_since = None
            return 0.0
        now = self.clock()
        if self.gone_since is None:
            self.gone_since = now
        return now - self.gone_since


def read_token(token_file: str | None, environ=os.environ) -> str:
    """The shared token from `token_file` or $JAXWEBRL_TOKEN; SystemExit naming both when neither has one."""
    if token_file:
        try:
            with open(token_file) as f:
                token = f.read().strip()
        except OSError as exc:
            raise SystemExit(f"rollout error: --token_file={token_file}: {exc.strerror}") from None
    else:
        token = environ.get("JAXWEBRL_TOKEN", "").strip()
    if not token:
        raise SystemExit("rollout error: no token: set $JAXWEBRL_TOKEN or --token_file=PATH to the policy "
                         "server's shared token (the one its TransportServer was started with)")
    return token


def build_spec(config) -> tuple[dict, int, int]:
    """(pool spec, number of workers, first worker id) from the config and the flags; every problem is one
    `rollout error:` line."""
    published = {}
    if _WORKDIR.value:
        try:
            published = read_published(_WORKDIR.value)
        except ValueError as err:
            cli.exit_with(f"rollout error: --workdir={_WORKDIR.value}: {err}")
    if published.get("fingerprint") is not None:
        check_fingerprint(published["fingerprint"], config)
    server = _SERVER.value or published.get("address")
    if not server or not server.startswith("tcp://") or server.rpartition(":")[2] in ("", "0"):
        cli.exit_with(f"rollout error: --server={server!r}: give the policy server's address, "
                      "e.g. --server=tcp://10.0.0.1:5555")
    buffer = _BUFFER.value or (path_for(config, _WORKDIR.value) if _WORKDIR.value else config.buffer.path)
    if not buffer:
        cli.exit_with("rollout error: --buffer is required (the trainer's ring buffer: shared path or "
                      "kvstore URL such as gs://bucket/run1/buffer)")
    try:
        RingBuffer.open(buffer)
    except Exception as exc:  # noqa: BLE001 - any failure to open means the workers could not write
        cli.exit_with(f"rollout error: --buffer={buffer}: cannot open the ring buffer ({exc}); start the "
                      "trainer first (it creates the buffer) and give this node the same path or URL")
    explicit = _TOKEN_FILE.value or os.environ.get("JAXWEBRL_TOKEN", "").strip()
    token = read_token(_TOKEN_FILE.value) if explicit or not published else published["token"]
    server_key = _SERVER_KEY.value or published.get("server_key")
    if server_key is not None:
        try:
            curve_key(server_key, "--server_key")
        except ValueError as err:
            cli.exit_with(f"rollout error: {err} (the run publishes it in WORKDIR/transport.json)")
    spec = worker_spec(config, buffer_path=buffer, address=server, token=token, stats_dir=_STATS_DIR.value,
                       server_key=server_key)
    num_workers = _NUM_WORKERS.value or config.rollout.num_workers
    if num_workers < 1:
        cli.exit_with(f"rollout error: --num_workers={num_workers}: need at least 1")
    first = first_worker_id(_FIRST_ID.value, num_workers, published.get("worker_ids"))
    return spec, num_workers, first


def first_worker_id(requested: int | None, num_workers: int, run_ids: range | None) -> int:
    """This node's first worker id: `requested` when its `num_workers` ids miss the run's own (`run_ids`, None: not
    published), else one `rollout error:` line; None: a random block of ID_BLOCK past the run's own ids."""
    end = run_ids.stop if run_ids is not None else 0
    if requested is None:
        return end + ID_BLOCK * (1 + secrets.randbelow(ID_BLOCKS))
    mine = range(requested, requested + num_workers)
    if run_ids is not None and mine.start < run_ids.stop and run_ids.start < mine.stop:
        cli.exit_with(f"rollout error: --first_worker_id={requested}: this node's worker ids {mine.start}-"
                      f"{mine.stop - 1} overlap the run's own workers' {run_ids.start}-{run_ids.stop - 1} (ids seed "
                      f"the task draw and key admission): use --first_worker_id={run_ids.stop} or more, or leave "
                      "it out")
    return requested


def check_fingerprint(published: dict, config) -> None:
    """Exits with one line naming every key where this host's config differs from the run it joins."""
    own = run_fingerprint(config)
    keys = mismatched_keys(published, own)
    if keys:
        diffs = "; ".join(f"{k}: run {published.get(k)!r}, this host {own.get(k)!r}" for k in keys)
        cli.exit_with(f"rollout error: --workdir={_WORKDIR.value}: this host's config does not match the run it "
                      f"joins ({diffs}): start it with the run's recipe and overrides (WORKDIR/config.json)")


def make_pool(spec: dict, num_workers: int, first: int):
    if _LAUNCHER.value == "ray":
        local = {} if _RAY_ADDRESS.value else {"include_dashboard": False}  # a Ray of its own on this node
        return RayWorkerPool(spec, num_workers, address=_RAY_ADDRESS.value, first_worker_id=first,
                             init_kwargs=local)
    return WorkerPool(spec, num_workers, first_worker_id=first)


def main(argv) -> int:
    del argv
    spec, num_workers, first = build_spec(cli.loaded_config("rollout error"))
    console.log_to_stderr()   # absl owns the root logger (and its verbosity): jaxwebrl's INFO lines go to stderr
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    address = spec["policy"]["address"]
    watch = ServerWatch(address)
    pool = make_pool(spec, num_workers, first)
    log.info("starting %d rollout workers (ids %d..%d) against %s, buffer %s", num_workers, first,
             first + num_workers - 1, address, spec["buffer"]["path"])
    with pool:
        log.info("rollout workers started (%s launcher)", _LAUNCHER.value)
        next_probe = 0.0
        while not stop.wait(1.0):
            try:
                pool.raise_if_failed()
            except RuntimeError as exc:
                log.error("%s", exc)
                return EXIT_FATAL
            if _GIVE_UP_S.value > 0 and time.monotonic() >= next_probe:
                next_probe = time.monotonic() + PROBE_EVERY_S
                silent = watch.silent_for()
                if silent >= _GIVE_UP_S.value:
                    where = f" (the trainer of {_WORKDIR.value})" if _WORKDIR.value else ""
                    log.error("nothing has listened at the policy server's address %s%s for %.0f s: its trainer is "
                              "gone; stopping the workers. Start the run again, then this launcher (or "
                              "--give_up_after_s=0 to wait for ever)", address, where, silent)
                    return EXIT_FATAL
        log.info("stopping the rollout workers (signal)")
    log.info("rollout workers stopped")
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=cli.flags_parser("rollout error"))
