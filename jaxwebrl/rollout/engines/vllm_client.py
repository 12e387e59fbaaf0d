"""The JAX side of the vLLM engine: starts `vllm_process` in the engine venv and talks to it over a private zmq
ipc socket in the project's wire format (no pickle).

    engine = VllmEngine(hf_dir, regex=action_space.response_regex(texts, memory), max_model_len=1024, max_num_seqs=8)
    future = engine.generate({"prompt_ids": ids, "images": [screenshot], "max_tokens": 48, "temperature": 1.0,
                              "top_p": 1.0, "top_k": 0, "seed": 7})
    result = future.result()           # tokens [N] int32, logprobs [N] float32, versions [N] int32, finish_reason
    engine.push(hf_arrays, version=1)  # seconds the engine took (weights reloaded, the three caches reset)
    engine.close()

One I/O thread owns the socket; `generate` may be called from any thread (requests join the running engine batch
at once). The engine venv's python is `vllm_python()`: $JAXWEBRL_VLLM_PYTHON, else /opt/jaxwebrl-vllm/bin/python
(`.ci/install-vllm` makes it).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import itertools
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

import zmq

import jaxwebrl
from jaxwebrl.rollout.wire import decode_message, encode_message

DEFAULT_VENV = "/opt/jaxwebrl-vllm"


def vllm_python() -> str:
    """The engine venv's python: $JAXWEBRL_VLLM_PYTHON, else DEFAULT_VENV/bin/python."""
    return os.environ.get("JAXWEBRL_VLLM_PYTHON") or os.path.join(DEFAULT_VENV, "bin", "python")


def install_lock_path() -> str:
    """The file `.ci/install-vllm` holds an flock on while it builds the venv: VENV.lock, beside the venv (the
    install removes and recreates the venv itself)."""
    return os.path.dirname(os.path.dirname(vllm_python())) + ".lock"


def vllm_available(wait_s: float = 0.0) -> bool:
    """True when the engine venv exists and no `.ci/install-vllm` is building it. An install in progress is waited
    for up to `wait_s` seconds first (CI installs the venv beside the test suite): False if it is still running."""
    deadline = time.monotonic() + wait_s
    try:
        fd = os.open(install_lock_path(), os.O_RDONLY)
    except OSError:   # no lock file: no install ever ran here, or the venv was made by hand
        return os.access(vllm_python(), os.X_OK)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(min(2.0, max(0.01, deadline - time.monotonic())))
        return os.access(vllm_python(), os.X_OK)
    finally:
        os.close(fd)   # releases the shared lock


class EngineError(RuntimeError):
    """The engine process failed a request, or died."""


class VllmEngine:
    """One engine process and its socket (see the module docstring)."""

    def __init__(self, model_dir: str, *, regex: str | None, max_model_len: int, max_num_seqs: int,
                 max_images: int = 1, seed: int = 0, version: int = 0, dtype: str = "float32",
                 tensor_parallel_size: int = 1, memory_fraction: float = 0.1, enforce_eager: bool = True,
                 start_timeout_s: float = 300.0, python: str | None = None):
        python = python or vllm_python()
        if not os.access(python, os.X_OK):
            raise EngineError(f"no vLLM engine venv at {python}: run `bash .ci/install-vllm` (or set "
                              "JAXWEBRL_VLLM_PYTHON to a python that has vllm)")
        self._dir = tempfile.mkdtemp(prefix="jaxwebrl-vllm-")   # 0700: the ipc socket is ours alone
        self.log_path = os.path.join(self._dir, "engine.log")
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PAIR)
        self._socket.setsockopt(zmq.LINGER, 0)
        address = f"ipc://{self._dir}/engine"
        self._socket.bind(address)
        config = {"model_dir": model_dir, "regex": regex, "max_model_len": int(max_model_len),
                  "max_num_seqs": int(max_num_seqs), "max_images": int(max_images), "seed": int(seed),
                  "version": int(version), "dtype": dtype, "tensor_parallel_size": int(tensor_parallel_size),
                  "memory_fraction": float(memory_fraction), "enforce_eager": bool(enforce_eager)}
        root = os.path.dirname(os.path.dirname(os.path.abspath(jaxwebrl.__file__)))
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                [python, "-m", "jaxwebrl.rollout.engines.vllm_process", "--address", address,
                 "--config", json.dumps(config)], stdout=log, stderr=subprocess.STDOUT, env=env,
                stdin=subprocess.DEVNULL)
        self._ids = itertools.count()
        self._pending: dict[str, concurrent.futures.Future] = {}
        self._outbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._failure: str | None = None
        self._closed = threading.Event()
        self.version = int(version)
        try:
            self.start_s = self._wait_ready(start_timeout_s)["start_s"]
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._io, name="vllm-engine-io", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ API
    def generate(self, payload: dict) -> concurrent.futures.Future:
        """Queue one request (see the module docstring); the future holds its result payload."""
        return self._call("generate", payload)

    def push(self, weights: dict, version: int, timeout_s: float = 600.0) -> float:
        """Load `weights` ({HF name: array}) as policy `version`; the engine's seconds for it."""
        reply = self._call("push", {"weights": weights, "version": int(version)}).result(timeout_s)
        self.version = int(reply["version"])
        return float(reply["push_s"])

    def stats(self, timeout_s: float = 30.0) -> dict:
        return self._call("stats", {}).result(timeout_s)

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise EngineError(f"vLLM engine stopped: {self._failure}")

    def close(self) -> None:
        """Stop the engine process (a `close` message, then SIGTERM, then SIGKILL) and fail what is pending."""
        if self._closed.is_set():
            return
        self._closed.set()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            self._outbox.put(encode_message({"op": "close"}, {}))
            thread.join(timeout=10)
        if self._process.poll() is None:
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
        self._fail_pending(self._failure or "engine closed")
        self._socket.close()
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "VllmEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _call(self, op: str, payload: dict) -> concurrent.futures.Future:
        self.raise_if_failed()
        if self._closed.is_set():
            raise EngineError("vLLM engine closed")
        request_id = f"r{next(self._ids)}"
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._pending[request_id] = future
        self._outbox.put(encode_message({"op": op, "id": request_id}, payload))
        return future

    def _log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _wait_ready(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._socket.poll(200):
                header, payload = decode_message(self._socket.recv_multipart(copy=False))
                if header.get("op") == "ready":
                    return payload
                raise EngineError(f"vLLM engine failed to start: {payload.get('error')} (log: {self.log_path})")
            if self._process.poll() is not None:
                raise EngineError(f"vLLM engine exited with {self._process.returncode} while starting; its log "
                                  f"{self.log_path} ends:\n{self._log_tail()}")
        raise EngineError(f"vLLM engine not ready after {timeout_s:.0f} s (log: {self.log_path})")

    def _fail_pending(self, reason: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(EngineError(f"vLLM engine stopped: {reason}"))

    def _io(self) -> None:
        """Send what is queued, hand each reply to its future; notice a dead engine process."""
        try:
            while True:
                while True:
                    try:
                        frames = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    self._socket.send_multipart(frames)
                    if json.loads(bytes(frames[0])).get("op") == "close":
                        return
                if self._socket.poll(5):
                    header, payload = decode_message(self._socket.recv_multipart(copy=False))
                    op = header.get("op")
                    if op == "fatal":
                        self._failure = str(payload.get("error"))
                        break
                    with self._lock:
                        future = self._pending.pop(str(header.get("id")), None)
                    if future is None:
                        continue
                    if op == "error":
                        future.set_exception(EngineError(str(header.get("error"))))
                    else:
                        future.set_result(payload)
                elif self._process.poll() is not None:
                    self._failure = (f"the engine process exited with {self._process.returncode}; its log "
                                     f"{self.log_path} ends: {' '.join(self._log_tail(3).split())[:300]}")
                    break
        except Exception as exc:  # noqa: BLE001 - recorded; every waiting caller hears it
            self._failure = f"{type(exc).__name__}: {exc}"
        self._fail_pending(self._failure or "engine I/O stopped")
