"""Request/reply transport between rollout workers and the policy server (pyzmq, no pickle).

A message is a zmq multipart of a JSON header and raw array frames (`wire.py`: NumPy arrays anywhere in a payload
dict travel as frames and come back with the same dtype and shape; everything else is plain JSON).

Authentication happens at connection time, before any message is accepted: the server is a ZMQ PLAIN server
whose ZAP handler admits a peer only when its password is the shared token (compared in constant time). A peer
without it never gets a message into the server's memory: libzmq closes the connection after the handshake
(and drops any handshake frame above ``max_message_bytes``). The client watches its socket's handshake events
and raises :class:`TransportAuthError` at once on a wrong token, and :class:`TransportError` when the connection
to the server drops while a request waits for its reply (a dead server is an error within a second, never a
silent wait for ``timeout_s``). The server binds 127.0.0.1 unless given another host; PLAIN does not encrypt.

CurveZMQ (``curve_secret_key`` on the server, its public key as ``server_key`` on the client) encrypts every
frame and authenticates the server; it replaces PLAIN, and the token still authorizes: a client's CURVE key pair
is derived from the token (`token_keypair`), and the ZAP handler admits only the public key of the server's
own token. A client that knows the server's public key but not the token is refused like a wrong PLAIN password.

    public, secret = zmq.curve_keypair()
    server = TransportServer(handler, token=token, curve_secret_key=secret)
    client = TransportClient(address, token=token, server_key=public)

What an authenticated peer sends is checked before anything is decoded or copied: whole-message size (all
frames together) at most ``max_message_bytes``, then the message format's own checks (`wire.decode_message`).
Any problem, and any exception of the handler, becomes an error
reply; the serve loop survives everything (if its thread dies anyway, ``raise_if_failed`` says so in one line).

    server = TransportServer(handler, token=token)        # handler(request: dict) -> dict, called on a pool
    server.start(); address = server.address              # "tcp://127.0.0.1:PORT"
    client = TransportClient(address, token=token)
    reply = client.request({"op": "generate", "image_refs": np.array([3, 4])})

The handler runs on ``num_threads`` threads so a batching backend sees concurrent requests from many clients.

(Past ~400 lines on purpose: the server and the client of one protocol, whose handshake, liveness and error paths
mirror each other and are read together.)
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import itertools
import logging
import os
import queue
import secrets
import threading
import time
from typing import Any, Callable

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from jaxwebrl.rollout.rate_limited_log import RateLimitedLog
from jaxwebrl.rollout.wire import (PROTOCOL, RequestRefused, TransportAuthError, TransportError, TransportRequestRefused,
                                   TransportTimeout, decode_message, echoable_id, encode_message, error_reply,
                                   short_text)

# Paper scale: a reply is 4 arrays of <= 16k tokens (~0.2 MB), a request a chat of a few steps (~0.1 MB).
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20
PLAIN_USERNAME = b"jaxwebrl"
ZAP_DOMAIN = b"jaxwebrl"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"
NOT_CONNECTED_WARNING_MS = 30_000  # a client with no connection says so this often while it waits

log = logging.getLogger(__name__)

Handler = Callable[[dict], dict]


def new_token() -> str:
    """A fresh random shared token (32 hex characters)."""
    return secrets.token_hex(16)


def token_keypair(token: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 CurveZMQ keys derived from the token: what a client with that token presents."""
    secret = z85.encode(hashlib.sha256(b"jaxwebrl transport token\0" + _check_token(token).encode()).digest())
    return zmq.curve_public(secret), secret


def _check_token(token: str | None) -> str:
    if not isinstance(token, str) or not token:
        raise ValueError(
            "transport token must be a non-empty string; generate one with "
            "jaxwebrl.rollout.transport.new_token() and give the same one to the server and every worker"
        )
    if len(token.encode()) > 255 or not token.isprintable():
        raise ValueError("transport token must be at most 255 bytes of printable text; use "
                         "jaxwebrl.rollout.transport.new_token()")
    return token


# ----------------------------------------------------------------------------------------------------------
# Server


class TransportServer:
    """ROUTER server: admits only peers with the token (ZAP, at connection time), checks each message, and runs
    ``handler`` on a thread pool.

    Replies are routed back to the requesting client; any number of clients may be connected. A malformed
    message or a handler exception becomes an error reply (the client raises :class:`TransportError` naming
    it); the server goes on. ``requests_refused`` counts connections refused for a wrong token.
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
        curve_secret_key: str | bytes | None = None,
    ):
        self._handler = handler
        self._token = _check_token(token).encode()
        self._curve_secret = None if curve_secret_key is None else curve_key(curve_secret_key, "curve_secret_key")
        self._token_public = z85.decode(token_keypair(token)[0])   # the only CURVE client key admitted
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
        self._counts_lock = threading.Lock()
        self._warn = RateLimitedLog(log)
        self.address: str | None = None
        self.requests_served = 0
        self.requests_refused = 0
        self.requests_malformed = 0
        self._start_error: BaseException | None = None
        self._failure: str | None = None

    def start(self) -> "TransportServer":
        """Bind and start serving; returns self. ``self.address`` is the endpoint clients connect to."""
        if self._thread is not None:
            raise RuntimeError("TransportServer already started")
        self._thread = threading.Thread(target=self._serve_forever, name="transport-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def raise_if_failed(self) -> None:
        """RuntimeError (one line) when the serving thread died; workers would otherwise wait for replies."""
        if self._failure is not None:
            raise RuntimeError(f"policy server transport at {self.address} stopped: {self._failure}")
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RuntimeError(f"policy server transport at {self.address} stopped: its thread exited")

    def close(self) -> None:
        """Stop serving and release the port (pending handler calls are abandoned)."""
        self._stop.set()
        try:
            os.write(self._wake_write, b"x")
        except OSError:
            pass
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

    def _count(self, name: str) -> None:
        with self._counts_lock:
            setattr(self, name, getattr(self, name) + 1)

    def _serve_forever(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - recorded for raise_if_failed, then the thread ends
            self._record_failure(exc)   # (the serve loop's own failures are recorded already, see _serve)
            self._ready.set()

    def _record_failure(self, exc: BaseException) -> None:  # what raise_if_failed reports (the first one)
        if self._failure is None:
            self._failure = f"{type(exc).__name__}: {short_text(exc, 300)}"
            log.error("policy server transport stopped: %s", self._failure)

    def _serve(self) -> None:
        context = zmq.Context()
        zap = context.socket(zmq.REP)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(_ZAP_ENDPOINT)  # before the ROUTER accepts anyone: every handshake asks it
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if self._curve_secret is not None:
            socket.setsockopt(zmq.CURVE_SERVER, 1)
            socket.setsockopt(zmq.CURVE_SECRETKEY, self._curve_secret)
        else:
            socket.setsockopt(zmq.PLAIN_SERVER, 1)
        socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        try:
            if self._port:
                socket.bind(f"tcp://{self._host}:{self._port}")
            else:
                socket.bind(f"tcp://{self._host}:*")
            self.address = socket.getsockopt_string(zmq.LAST_ENDPOINT)
            if (self._curve_secret is None and not self._host.startswith("127.")
                    and self._host not in ("localhost", "::1")):
                log.warning("policy server listens on %s: the token and prompts travel unencrypted, so keep this "
                            "port on a private network, or turn on CurveZMQ (rollout.curve)", self.address)
        except zmq.ZMQError as exc:
            self._start_error = OSError(f"policy server cannot bind tcp://{self._host}:{self._port or '*'}: {exc}")
            for sock in (socket, zap):
                sock.close()
            context.term()
            self._ready.set()
            return
        self._ready.set()
        pool = concurrent.futures.ThreadPoolExecutor(self._num_threads, thread_name_prefix="transport-handler")
        poller = zmq.Poller()
        for item in (socket, zap, self._wake_read):
            poller.register(item, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    self._serve_once(poller, socket, zap, pool)
                except Exception as exc:  # noqa: BLE001 - the loop must outlive anything one message causes
                    if self._stop.is_set():
                        break
                    self._warn.warning("loop", "transport: serve loop error (%s: %s); serving on",
                                       type(exc).__name__, short_text(exc))
        except BaseException as exc:  # recorded before the sockets close: a client hears "lost the connection"
            self._record_failure(exc)  # only once raise_if_failed (what a supervisor polls) says why
            raise
        finally:
            self._close_sockets(pool, (socket, zap), context)

    def _close_sockets(self, pool, sockets, context) -> None:
        """The serve thread's last act: pending handler calls abandoned, sockets closed (clients see it)."""
        pool.shutdown(wait=False, cancel_futures=True)
        for sock in sockets:
            sock.close(linger=0)
        context.term()

    def _serve_once(self, poller, socket, zap, pool) -> None:
        events = dict(poller.poll(timeout=500))
        if zap in events:
            self._answer_zap(zap)
        if socket in events:
            for _ in range(256):  # then let replies and handshakes through
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                self._dispatch(socket, pool, frames)
        if self._wake_read in events:
            try:
                os.read(self._wake_read, 4096)
            except (BlockingIOError, OSError):
                pass
        while True:
            try:
                identity, reply = self._replies.get_nowait()
            except queue.Empty:
                break
            socket.send_multipart([identity] + reply, copy=False)

    def _answer_zap(self, zap) -> None:
        """ZAP 1.0: admit a PLAIN peer whose password is the token, or (CURVE) a peer whose public key is the
        token's (`token_keypair`); refuse everyone else."""
        try:
            request = zap.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if len(request) < 6:
            zap.send_multipart([b"1.0", b"", b"400", b"malformed ZAP request", b"", b""])
            return
        version, request_id, _, address, _, mechanism = request[:6]
        credentials = request[6:]
        if self._curve_secret is not None:
            admitted = (mechanism == b"CURVE" and len(credentials) == 1
                        and hmac.compare_digest(credentials[0], self._token_public))
        else:
            admitted = (mechanism == b"PLAIN" and len(credentials) == 2
                        and hmac.compare_digest(credentials[1], self._token))
        if not admitted:
            self._count("requests_refused")
            self._warn.warning("auth", "transport: refused a connection from %s with a wrong token",
                               address.decode(errors="replace"))
        zap.send_multipart([b"1.0", request_id, b"200" if admitted else b"400",
                            b"OK" if admitted else b"wrong token", b"", b""])

    def _dispatch(self, socket, pool, frames: list) -> None:
        identity, frames = frames[0], frames[1:]
        try:
            size = sum(len(frame) for frame in frames)
            if size > self._max_message_bytes:
                raise TransportError(f"message of {size} bytes exceeds the limit of {self._max_message_bytes}")
            head, payload = decode_message(frames)
        except Exception as exc:  # noqa: BLE001 - whatever the peer sent, it gets an error reply
            self._count("requests_malformed")
            self._warn.warning("protocol", "transport: refused a malformed message: %s", short_text(exc))
            socket.send_multipart([identity] + error_reply(None, "protocol", short_text(exc, 300)), copy=False)
            return
        pool.submit(self._run_handler, identity, echoable_id(head.get("id")), payload)

    def _run_handler(self, identity, request_id: Any, payload: dict) -> None:
        try:
            result = self._handler(payload)
            if not isinstance(result, dict):
                raise TypeError(f"handler returned {type(result).__name__}, expected dict")
            reply = encode_message({"id": request_id, "ok": True}, result)
            self._count("requests_served")
        except Exception as exc:  # the server must outlive a bad request
            if self._stop.is_set():  # shutting down: the handler was told to stop, nothing went wrong
                log.debug("transport: handler stopped during shutdown: %s", exc)
            else:
                log.warning("transport: handler failed on a request: %s: %s", type(exc).__name__, short_text(exc, 300),
                            exc_info=log.isEnabledFor(logging.DEBUG))
            kind = "refused" if isinstance(exc, RequestRefused) else "handler"
            reply = error_reply(request_id, kind, f"{type(exc).__name__}: {short_text(exc, 300)}")
        self._replies.put((identity, reply))
        try:
            os.write(self._wake_write, b"x")
        except OSError:  # closed during shutdown
            pass


# ----------------------------------------------------------------------------------------------------------
# Client


class TransportClient:
    """DEALER client: one request in flight at a time (a lock serialises threads); replies to requests that
    timed out earlier are recognised by id and dropped. A wrong token raises TransportAuthError as soon as the
    handshake is refused; a connection lost while waiting raises TransportError (the server stopped)."""

    def __init__(self, address: str, *, token: str, timeout_s: float = 600.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, server_key: str | bytes | None = None):
        self.address = address
        self._token = _check_token(token)
        server_key = None if server_key is None else curve_key(server_key, "server_key")   # before any socket
        self.timeout_s = float(timeout_s)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        if server_key is not None:   # CurveZMQ: encrypted, the key pair derived from the token authorizes
            public, secret = token_keypair(self._token)
            self._socket.setsockopt(zmq.CURVE_SERVERKEY, server_key)
            self._socket.setsockopt(zmq.CURVE_PUBLICKEY, public)
            self._socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
        else:
            self._socket.setsockopt(zmq.PLAIN_USERNAME, PLAIN_USERNAME)
            self._socket.setsockopt(zmq.PLAIN_PASSWORD, self._token.encode())
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_DISCONNECTED)
        self._socket.connect(address)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._refused: str | None = None  # why the server refused us (sticky: the token will not change)
        self._connected = False

    def request(self, payload: dict, *, timeout_s: float | None = None) -> dict:
        """Send ``payload``, wait for the reply payload. Raises TransportAuthError, TransportTimeout,
        TransportError (server-side failure, or the connection dropped while waiting)."""
        timeout_ms = int(1000 * (self.timeout_s if timeout_s is None else timeout_s))
        with self._lock:
            if self._closed:
                raise TransportError("TransportClient is closed")
            self._connection_events(waiting=False)  # what happened while idle (a refusal is sticky)
            request_id = next(self._ids)
            self._socket.send_multipart(encode_message({"id": request_id}, payload), copy=False)
            poller = zmq.Poller()
            poller.register(self._socket, zmq.POLLIN)
            poller.register(self._monitor, zmq.POLLIN)
            deadline = _now_ms() + timeout_ms
            while True:
                remaining = deadline - _now_ms()
                events = dict(poller.poll(timeout=min(remaining, NOT_CONNECTED_WARNING_MS))) if remaining > 0 else {}
                if not events and _now_ms() < deadline:
                    if not self._connected:  # never silent for long: say that nothing answers at all
                        log.warning("still no connection to the policy server at %s (is it running and reachable?)",
                                    self.address)
                    continue
                if not events:
                    raise TransportTimeout(
                        f"no reply from the policy server at {self.address} within {timeout_ms / 1000:.1f} s; "
                        "is it running and reachable?"
                    )
                if self._monitor in events:
                    self._connection_events(waiting=True)
                if self._socket not in events:
                    continue
                head, reply = decode_message(self._socket.recv_multipart(copy=False))
                if head.get("id") not in (request_id, None):
                    continue  # a late reply to an earlier, timed-out request
                if head.get("ok"):
                    return reply
                kind, message = head.get("error_kind"), head.get("error", "unknown error")
                error = TransportRequestRefused if kind == "refused" else TransportError
                raise error(f"policy server at {self.address} failed ({kind}): {message}")

    def _connection_events(self, waiting: bool) -> None:
        """Read the socket's handshake events; raise on a refusal, or on a lost connection while ``waiting``."""

        lost = False
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refused = "auth"
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self._refused = self._refused or "protocol"
            elif event == zmq.EVENT_DISCONNECTED:
                lost, self._connected = True, False
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                lost, self._refused, self._connected = False, None, True
        if self._refused == "auth":
            raise TransportAuthError(
                f"policy server at {self.address} refused the connection: wrong token. Give the rollout workers "
                "the server's token (the worker pool spec's policy.token; for launch/rollout.py, $JAXWEBRL_TOKEN "
                "or --token_file)."
            )
        if self._refused == "protocol":
            raise TransportError(f"the handshake with {self.address} failed: the peer is not a {PROTOCOL} policy "
                                 "server (another jaxwebrl version, or another program on that port)")
        if lost and waiting:
            raise TransportError(f"lost the connection to the policy server at {self.address} while waiting for a "
                                 "reply (the server stopped or restarted)")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._socket.disable_monitor()
                self._monitor.close(linger=0)
                self._socket.close(linger=0)
                self._context.term()

    def __enter__(self) -> "TransportClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def curve_key(key: str | bytes, what: str) -> bytes:
    """A CurveZMQ key as the 40 Z85 characters libzmq takes; ValueError naming `what` otherwise (launchers
    check a key given on the command line with it before any worker starts)."""
    key = key.encode() if isinstance(key, str) else bytes(key)
    try:
        if len(key) != 40 or len(z85.decode(key)) != 32:
            raise ValueError
    except (ValueError, KeyError, IndexError):
        raise ValueError(f"{what} must be a CurveZMQ key: 40 Z85 characters as zmq.curve_keypair() makes") from None
    return key


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
