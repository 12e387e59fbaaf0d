"""One HTTP(S) POST whose whole attempt (connect, request, status line and headers, body) ends by `timeout_s`.

A socket timeout bounds each read, not their sum: a server that trickles its headers or its body a byte at a time
holds the caller as long as it likes. Here a timer shuts the attempt's connections down once `timeout_s` has passed,
whatever read is under way, and the caller gets `DeadlinePassed` (a TimeoutError), as for a read that timed out. It
shuts each down through a second descriptor of the connection taken when it opens, since over HTTPS the TLS socket
takes the first one over (the socket object first opened is detached, and shutting it down would do nothing): so the
deadline holds through the TLS handshake and every read after it.
Proxies from the environment are honoured as by `urllib.request.urlopen`; an HTTP error status raises
`urllib.error.HTTPError` as there, and so does a redirect: it is never followed (urllib would follow a POST's 301-303
as a GET that carries the request's headers, its Authorization included, to wherever Location points).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.request


class DeadlinePassed(TimeoutError):
    """The attempt ran past its timeout_s; the message says 'timed out (S s > timeout_s=T)'."""


def post_within(url: str, data: bytes, headers: dict[str, str], timeout_s: float) -> bytes:
    """The body of the answer to POST `data` to `url`, all of it received within `timeout_s` seconds of the call."""
    deadline = _Deadline(timeout_s)
    opener = urllib.request.build_opener(_WatchedHTTP(deadline), _WatchedHTTPS(deadline), _NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data, headers), timeout=timeout_s) as response:
            body = response.read()
    except Exception as err:   # a shut socket surfaces as a cut answer, a reset or a protocol error
        if deadline.passed or deadline.elapsed() >= deadline.seconds:   # or a read's own timeout, as long
            raise DeadlinePassed(deadline.message()) from err
        raise
    finally:
        deadline.cancel()
    if deadline.passed:
        raise DeadlinePassed(deadline.message())
    return body


class _Deadline:
    """A timer that shuts down every connection opened through `connect` so far, or later, once `seconds` have
    passed; `cancel` stops it and closes its descriptors."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.passed = False
        self._start = time.monotonic()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(self.seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def message(self) -> str:
        return f"timed out ({self.elapsed():.3f} s > timeout_s={self.seconds:g})"

    def cancel(self) -> None:
        self._timer.cancel()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()   # the second descriptor only: the connection closes with its owner's

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._sockets:
                _shut(sock)

    def connect(self, address, timeout=None, source_address=None, *args, **kwargs) -> socket.socket:
        """`socket.create_connection`, its connect bounded by the time left, its connection watched (a descriptor of
        it that no TLS wrapper takes over)."""
        left = max(self.seconds - self.elapsed(), 1e-3)
        bound = min(timeout, left) if isinstance(timeout, (int, float)) else left
        sock = socket.create_connection(address, bound, source_address, *args, **kwargs)
        with self._lock:
            watched = sock.dup()
            self._sockets.append(watched)
            if self.passed:
                _shut(watched)
        return sock

    def connection(self, kind: type[http.client.HTTPConnection]):
        """A factory of `kind` connections whose sockets this deadline watches (urllib's `do_open` calls it)."""
        def make(host, **kwargs):
            conn = kind(host, **kwargs)
            conn._create_connection = self.connect   # http.client's hook for how a connection opens its socket
            return conn
        return make


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)   # wakes a read blocked on it in another thread
    except OSError:
        pass   # already closed


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None   # urllib then raises the redirect as an HTTPError


class _WatchedHTTP(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(self._deadline.connection(http.client.HTTPConnection), req)


class _WatchedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def https_open(self, req):
        return self.do_open(self._deadline.connection(http.client.HTTPSConnection), req, context=self._context)
