"""Request/reply transport between rollout workers and the policy server (pyzmq, no pickle).

A message is a zmq multipart: frame 0 is a UTF-8 JSON header, frames 1.. are raw little-endian array
buffers. NumPy arrays anywhere in a payload dict travel as frames and come back as arrays with the same
dtype and shape; everything else must be plain JSON (str, int, float, bool, None, list, dict with str keys).

Every request carries a shared token; the server answers a wrong one with an authentication error that the
client raises as :class:`TransportAuthError`. The server binds 127.0.0.1 unless given another host.

    server = TransportServer(handler, token=token)        # handler(request: dict) -> dict, called on a pool
    server.start(); address = server.address              # "tcp://127.0.0.1:PORT"
    client = TransportClient(address, token=token)
    reply = client.request({"op": "generate", "image_refs": np.array([3, 4])})

The handler runs on ``num_threads`` threads so a batching backend sees concurrent requests from many clients.
"""

from __future__ import annotations

import concurrent.futures
import hmac
import itertools
import json
import logging
import os
import queue
import secrets
import threading
import time
from typing import Any, Callable

import numpy as np
import zmq

PROTOCOL = "jaxwebrl-transport/1"
ARRAY_MARKER = "__ndarray__"
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
_ALLOWED_KINDS = "biuf"  # bool, signed int, unsigned int, float

log = logging.getLogger(__name__)

Handler = Callable[[dict], dict]


class TransportError(RuntimeError):
    """The peer answered with an error, or the message was malformed."""


class TransportAuthError(TransportError, PermissionError):
    """The server refused the request because the shared token did not match."""


class TransportTimeout(TransportError, TimeoutError):
    """No reply arrived within the timeout."""


def new_token() -> str:
    """A fresh random shared token (32 hex characters)."""
    return secrets.token_hex(16)


def _check_token(token: str | None) -> str:
    if not isinstance(token, str) or not token:
        raise ValueError(
            "transport token must be a non-empty string; generate one with "
            "jaxwebrl.rollout.transport.new_token() and give the same one to the server and every worker"
        )
    return token


# ----------------------------------------------------------------------------------------------------------
# Encoding


def _encode_value(value: Any, arrays: list[np.ndarray], path: str) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"{path}: array dtype {value.dtype} cannot travel; use bool, int, uint or float")
        arrays.append(value.astype(value.dtype.newbyteorder("<"), order="C", copy=False))
        return {ARRAY_MARKER: len(arrays) - 1}
    if isinstance(value, dict):
        out = {}
        for key, child in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path}: dict key {key!r} is not a str; JSON headers need str keys")
            if key == ARRAY_MARKER:
                raise ValueError(f"{path}: key {ARRAY_MARKER!r} is reserved by the transport")
            out[key] = _encode_value(child, arrays, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_encode_value(child, arrays, f"{path}[{i}]") for i, child in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise TypeError(
        f"{path}: value of type {type(value).__name__} cannot travel; send JSON types or NumPy arrays"
    )


def _decode_value(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, dict):
        if set(value) == {ARRAY_MARKER}:
            return arrays[value[ARRAY_MARKER]]
        return {key: _decode_value(child, arrays) for key, child in value.items()}
    if isinstance(value, list):
        return [_decode_value(child, arrays) for child in value]
    return value


def encode_message(header: dict, payload: dict) -> list[bytes | memoryview]:
    """Frames for ``payload`` (arrays become frames) under ``header`` (plain JSON fields)."""
    arrays: list[np.ndarray] = []
    body = _encode_value(payload, arrays, "payload")
    specs = [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]
    head = dict(header, protocol=PROTOCOL, payload=body, arrays=specs)
    return [json.dumps(head, separators=(",", ":")).encode()] + [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays]


def decode_message(frames: list[bytes]) -> tuple[dict, dict]:
    """(header, payload) from frames; arrays are fresh writable NumPy arrays."""
    if not frames:
        raise TransportError("empty message")
    try:
        head = json.loads(bytes(frames[0]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TransportError(f"message header is not JSON: {exc}") from None
    if not isinstance(head, dict) or head.get("protocol") != PROTOCOL:
        raise TransportError(f"message is not {PROTOCOL}: peer runs another version or another program")
    specs = head.get("arrays", [])
    if len(specs) != len(frames) - 1:
        raise TransportError(f"header names {len(specs)} arrays but {len(frames) - 1} frames arrived")
    arrays = []
    for spec, frame in zip(specs, frames[1:]):
        dtype = np.dtype(spec["dtype"])
        if dtype.kind not in _ALLOWED_KINDS:
            raise TransportError(f"array dtype {dtype} is not allowed on the wire")
        shape = tuple(int(d) for d in spec["shape"])
        buffer = bytes(frame)
        if len(buffer) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise TransportError(f"array frame of {len(buffer)} bytes does not match {dtype} {shape}")
        arrays.append(np.frombuffer(bytearray(buffer), dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="), copy=False))
    return head, _decode_value(head.get("payload", {}), arrays)


# ----------------------------------------------------------------------------------------------------------
# Server


class TransportServer:
    """ROUTER server: authenticates each request and runs ``handler`` on a thread pool.

    Replies are routed back to the requesting client; any number of clients may be connected. A handler
    exception becomes an error reply (the client raises :class:`TransportError` naming it); the server goes on.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        num_threads: int = 16,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ):
        self._handler = handler
        self._token = _check_token(token).encode()
        self._host, self._port = host, int(port)
        self._num_threads = int(num_threads)
        self._max_message_bytes = int(max_message_bytes)
        self._context: zmq.Context | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self.address: str | None = None
        self.requests_served = 0
        self.requests_refused = 0
        self._start_error: BaseException | None = None

    def start(self) -> "TransportServer":
        """Bind and start serving; returns self. ``self.address`` is the endpoint clients connect to."""
        if self._thread is not None:
            raise RuntimeError("TransportServer already started")
        self._thread = threading.Thread(target=self._serve, name="transport-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    def close(self) -> None:
        """Stop serving and release the port (pending handler calls are abandoned)."""
        self._stop.set()
        os.write(self._wake_write, b"x")
        if self._thread is not None:
            self._thread.join(timeout=10)
        for fd in (self._wake_read, self._wake_write):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "TransportServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _serve(self) -> None:
        context = zmq.Context()
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        try:
            if self._port:
                socket.bind(f"tcp://{self._host}:{self._port}")
            else:
                socket.bind(f"tcp://{self._host}:*")
            self.address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
            if not self._host.startswith("127.") and self._host not in ("localhost", "::1"):
                log.warning("policy server listens on %s: the token and prompts travel unencrypted, so keep this "
                            "port on a private network (or reach it through an SSH tunnel)", self.address)
        except zmq.ZMQError as exc:
            self._start_error = OSError(f"policy server cannot bind tcp://{self._host}:{self._port or '*'}: {exc}")
            socket.close()
            context.term()
            self._ready.set()
            return
        self._ready.set()
        pool = concurrent.futures.ThreadPoolExecutor(self._num_threads, thread_name_prefix="transport-handler")
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(timeout=500))
                if socket in events:
                    while True:
                        try:
                            frames = socket.recv_multipart(zmq.NOBLOCK, copy=True)
                        except zmq.Again:
                            break
                        self._dispatch(socket, pool, frames)
                if self._wake_read in events:
                    try:
                        os.read(self._wake_read, 4096)
                    except BlockingIOError:
                        pass
                while True:
                    try:
                        identity, reply = self._replies.get_nowait()
                    except queue.Empty:
                        break
                    socket.send_multipart([identity] + reply, copy=False)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            socket.close(linger=0)
            context.term()

    def _dispatch(self, socket, pool, frames: list[bytes]) -> None:
        identity, frames = frames[0], frames[1:]
        try:
            head, payload = decode_message(frames)
        except (TransportError, KeyError, TypeError, ValueError) as exc:
            socket.send_multipart([identity] + _error_reply(None, "protocol", str(exc)))
            return
        request_id = head.get("id")
        token = str(head.get("token", "")).encode()
        if not hmac.compare_digest(token, self._token):
            self.requests_refused += 1
            log.warning("transport: refused a request with a wrong token")
            socket.send_multipart([identity] + _error_reply(request_id, "auth", "wrong token"))
            return
        pool.submit(self._run_handler, identity, request_id, payload)

    def _run_handler(self, identity: bytes, request_id: Any, payload: dict) -> None:
        try:
            result = self._handler(payload)
            if not isinstance(result, dict):
                raise TypeError(f"handler returned {type(result).__name__}, expected dict")
            reply = encode_message({"id": request_id, "ok": True}, result)
            self.requests_served += 1
        except Exception as exc:  # the server must outlive a bad request
            log.exception("transport: handler failed")
            reply = _error_reply(request_id, "handler", f"{type(exc).__name__}: {exc}")
        self._replies.put((identity, reply))
        try:
            os.write(self._wake_write, b"x")
        except OSError:  # closed during shutdown
            pass


def _error_reply(request_id: Any, kind: str, message: str) -> list:
    return encode_message({"id": request_id, "ok": False, "error_kind": kind, "error": message}, {})


# ----------------------------------------------------------------------------------------------------------
# Client


class TransportClient:
    """DEALER client: one request in flight at a time (a lock serialises threads); replies to requests that
    timed out earlier are recognised by id and dropped."""

    def __init__(self, address: str, *, token: str, timeout_s: float = 600.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.address = address
        self._token = _check_token(token)
        self.timeout_s = float(timeout_s)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        self._socket.connect(address)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False

    def request(self, payload: dict, *, timeout_s: float | None = None) -> dict:
        """Send ``payload``, wait for the reply payload. Raises TransportAuthError, TransportTimeout,
        TransportError (server-side failure)."""
        timeout_ms = int(1000 * (self.timeout_s if timeout_s is None else timeout_s))
        with self._lock:
            if self._closed:
                raise TransportError("TransportClient is closed")
            request_id = next(self._ids)
            self._socket.send_multipart(encode_message({"id": request_id, "token": self._token}, payload),
                                        copy=False)
            poller = zmq.Poller()
            poller.register(self._socket, zmq.POLLIN)
            deadline = _now_ms() + timeout_ms
            while True:
                remaining = deadline - _now_ms()
                if remaining <= 0 or not poller.poll(timeout=remaining):
                    raise TransportTimeout(
                        f"no reply from the policy server at {self.address} within {timeout_ms / 1000:.1f} s; "
                        "is it running and reachable?"
                    )
                head, reply = decode_message(self._socket.recv_multipart())
                if head.get("id") not in (request_id, None):
                    continue  # a late reply to an earlier, timed-out request
                if head.get("ok"):
                    return reply
                kind, message = head.get("error_kind"), head.get("error", "unknown error")
                if kind == "auth":
                    raise TransportAuthError(
                        f"policy server at {self.address} refused the request: {message}. Give the rollout "
                        "workers the same transport token as the server (config.rollout.transport_token)."
                    )
                raise TransportError(f"policy server at {self.address} failed ({kind}): {message}")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._socket.close(linger=0)
                self._context.term()

    def __enter__(self) -> "TransportClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
