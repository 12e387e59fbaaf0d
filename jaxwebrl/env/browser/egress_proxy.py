"""The egress proxy: every TCP connection a task's Chromium opens goes through it and is checked against the
task's allowlist, whatever opened it (page, WebSocket, WebRTC over TCP, reports, prefetches).

Why a proxy: CDP `Fetch` (request_guard.py) pauses HTTP(S) and file:// requests only. It never sees a
WebSocket handshake (checked in Chromium 156: a page exchanged data with a ws:// server on a port outside the
allowlist while Fetch paused every other request), nor WebRTC, whose ICE traffic leaves as UDP (STUN) or as
TCP to a TURN server from the network service. Chromium does route every TCP connection of the profile,
WebSockets and WebRTC's TCP included, through its configured proxy, so the browser gets

    --proxy-server=socks5://127.0.0.1:PORT --proxy-bypass-list=<-loopback>   (loopback goes through it too)
    pref webrtc.ip_handling_policy = disable_non_proxied_udp                  (WebRTC: proxied TCP only)

and a SOCKS5 proxy carries no UDP: WebRTC has no UDP path at all (no STUN, no host candidates), and QUIC and
WebTransport, which cannot be proxied, fail. (`--force-webrtc-ip-handling-policy` is not honoured by this
Chromium: the pref is.)

Per connection (SOCKS5 CONNECT; no other command, no authentication):
1. the destination host:port must be an origin the allowlist names (`UrlAllowlist.allows_origin`), or the
   proxy answers "not allowed by ruleset" without connecting anywhere;
2. the proxy connects, then reads what the browser sends first: a TLS ClientHello (https:// or wss://: the
   path is encrypted, the origin check is the check), or an HTTP/1 request whose URL, http://host:port/path or
   ws://host:port/path for a WebSocket upgrade, must be allowed; anything else (STUN/TURN over TCP, raw bytes,
   HTTP/2 prior knowledge) is refused;
3. only then are bytes relayed, both ways, until either side closes.
Later requests on a kept-alive HTTP connection go to the same, allowed origin; their paths are the request
guard's to check (it sees every HTTP request).

    proxy = EgressProxy(lambda: browser.allowlist).start()   # proxy.port; proxy.blocked: refused destinations
    proxy.close()
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import re
import socket
import threading
from typing import Callable

from jaxwebrl.env.browser.allowlist import UrlAllowlist

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 300.0           # a connection that sends nothing this long is closed (browsers preconnect)
MAX_REQUEST_HEAD_BYTES = 64 << 10
_METHOD_PREFIX = re.compile(rb"[A-Z]{1,16}(?: |$)")
_REQUEST_LINE = re.compile(rb"([A-Z]+) (\S+) HTTP/1\.[01]\r\n")
_UPGRADE_WEBSOCKET = re.compile(rb"\r\nupgrade:[ \t]*websocket[ \t]*\r\n", re.IGNORECASE)
_SOCKS_OK, _SOCKS_NOT_ALLOWED, _SOCKS_UNREACHABLE, _SOCKS_REFUSED = 0, 2, 4, 5
_SOCKS_BAD_COMMAND, _SOCKS_BAD_ADDRESS = 7, 8


class _Refused(Exception):
    """The connection leaves the allowlist (or is not a browser protocol); message: what was refused."""


class EgressProxy:
    """A SOCKS5 proxy on 127.0.0.1 that lets a connection out only to the allowlist (see module docstring).

    allowlist: called for every connection, so the browser can swap allowlists between tasks.
    blocked: the most recent refused destinations (newest last), e.g. "ws://127.0.0.1:8123/x".
    """

    def __init__(self, allowlist: Callable[[], UrlAllowlist], *, idle_timeout_s: float = IDLE_TIMEOUT_S):
        self._allowlist = allowlist
        self.idle_timeout_s = float(idle_timeout_s)
        self.blocked: collections.deque[str] = collections.deque(maxlen=100)
        self.connections = 0
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.port: int | None = None

    def start(self) -> "EgressProxy":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self._listener, self.port = listener, listener.getsockname()[1]
        threading.Thread(target=self._accept, name="egress-proxy", daemon=True).start()
        return self

    @property
    def address(self) -> str:
        return f"socks5://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        self._closed.set()
        if self._listener is not None:
            _close(self._listener)
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)

    # ------------------------------------------------------------------ per connection
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            if not self._track(client):
                return
            threading.Thread(target=self._serve, args=(client,), name="egress-proxy-conn", daemon=True).start()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed.is_set():
                _close(sock)
                return False
            self._open.add(sock)
            return True

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            client.settimeout(self.idle_timeout_s)
            host, port = self._socks_handshake(client)
            allowlist = self._allowlist()
            if not any(allowlist.allows_origin(scheme, host, port) for scheme in ("http", "https")):
                _socks_reply(client, _SOCKS_NOT_ALLOWED)
                raise _Refused(f"tcp://{_url_host(host)}:{port}")
            try:
                upstream = socket.create_connection((host, port), timeout=30)
            except OSError as exc:
                _socks_reply(client, _SOCKS_REFUSED if isinstance(exc, ConnectionRefusedError) else _SOCKS_UNREACHABLE)
                return
            if not self._track(upstream):
                return
            _socks_reply(client, _SOCKS_OK)
            first = self._first_bytes(client)
            self._check_first_bytes(allowlist, host, port, first)
            upstream.settimeout(None)
            client.settimeout(None)
            upstream.sendall(first)
            self._relay(client, upstream)
        except _Refused as refused:  # DEBUG: Chromium's own background calls (updates, sign-in) land here too
            self.blocked.append(str(refused))
            log.debug("egress proxy refused %s (outside the task allowlist)", refused)
        except (OSError, ValueError) as exc:  # the browser hung up, timed out, or spoke nonsense
            log.debug("egress proxy connection ended: %s", exc)
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    self._forget(sock)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        _close(sock)

    @staticmethod
    def _socks_handshake(client: socket.socket) -> tuple[str, int]:
        version, count = _recv_exact(client, 2)
        methods = _recv_exact(client, count)
        if version != 5 or 0 not in methods:
            client.sendall(b"\x05\xff")
            raise ValueError("not a SOCKS5 client without authentication")
        client.sendall(b"\x05\x00")
        version, command, _, kind = _recv_exact(client, 4)
        if version != 5 or command != 1:  # CONNECT only: no BIND, no UDP ASSOCIATE
            _socks_reply(client, _SOCKS_BAD_COMMAND)
            raise _Refused(f"SOCKS command {command} (only CONNECT is served)")
        if kind == 1:
            host = str(ipaddress.IPv4Address(_recv_exact(client, 4)))
        elif kind == 4:
            host = str(ipaddress.IPv6Address(_recv_exact(client, 16)))
        elif kind == 3:
            host = _recv_exact(client, _recv_exact(client, 1)[0]).decode("ascii", errors="replace").lower()
        else:
            _socks_reply(client, _SOCKS_BAD_ADDRESS)
            raise ValueError(f"SOCKS address type {kind}")
        port = int.from_bytes(_recv_exact(client, 2), "big")
        return host, port

    @staticmethod
    def _first_bytes(client: socket.socket) -> bytes:
        """The browser's first bytes: one TLS record header, or an HTTP/1 request head (up to its blank line)."""
        data = client.recv(65536)
        if not data:
            raise ValueError("closed before sending anything")
        if data[:1] == b"\x16" or not _METHOD_PREFIX.match(data):  # TLS, or not HTTP at all (refused below)
            return data
        while b"\r\n\r\n" not in data:
            if len(data) > MAX_REQUEST_HEAD_BYTES:
                raise _Refused("an HTTP request head over 64 KiB")
            more = client.recv(65536)
            if not more:
                raise ValueError("closed inside an HTTP request head")
            data += more
        return data

    @staticmethod
    def _check_first_bytes(allowlist: UrlAllowlist, host: str, port: int, first: bytes) -> None:
        origin = f"{_url_host(host)}:{port}"
        if first[:1] == b"\x16":
            if not allowlist.allows_origin("https", host, port):
                raise _Refused(f"https://{origin}/ (TLS)")
            return
        line = _REQUEST_LINE.match(first)
        if not line:
            raise _Refused(f"tcp://{origin} (not HTTP/1 or TLS: {first[:16]!r})")
        target = line.group(2).decode("latin-1")
        if "://" in target:  # absolute-form: its path, on the destination actually connected to
            target = "/" + target.split("://", 1)[1].partition("/")[2]
        if not target.startswith("/"):
            raise _Refused(f"tcp://{origin} (request target {target[:40]!r})")
        head = first[: first.index(b"\r\n\r\n") + 2]
        scheme = "ws" if _UPGRADE_WEBSOCKET.search(head) else "http"
        url = f"{scheme}://{origin}{target}"
        if not allowlist.allows(url):
            raise _Refused(url)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        back = threading.Thread(target=_pump, args=(upstream, client), name="egress-proxy-pump", daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _socks_reply(client: socket.socket, code: int) -> None:
    client.sendall(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ValueError("connection closed during the SOCKS handshake")
        data += chunk
    return data


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
