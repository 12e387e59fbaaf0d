"""The egress proxy's rules, spoken to as Chromium does (SOCKS5 CONNECT, then HTTP/1, WebSocket or TLS bytes),
against real loopback servers that record what reaches them."""

import socket

import pytest

from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.browser.egress_proxy import EgressProxy
from jaxwebrl.env.browser.probes import WebSocketProbe, serve_directory


@pytest.fixture
def site(tmp_path):
    (tmp_path / "page.html").write_text("<p>page</p>")
    server, url, seen = serve_directory(str(tmp_path))
    yield int(url.rsplit(":", 1)[1]), seen
    server.shutdown()
    server.server_close()


def _connect(proxy, port, command=1, host=b"127.0.0.1"):
    """A SOCKS5 CONNECT (or another command) to host:port; returns (socket, reply code)."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(b"\x05\x01\x00")
    assert sock.recv(2) == b"\x05\x00"
    sock.sendall(bytes([5, command, 0, 3, len(host)]) + host + port.to_bytes(2, "big"))
    reply = sock.recv(10)
    return sock, reply[1]


def _read_all(sock) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_http_paths_origins_and_commands(site):
    port, seen = site
    allowlist = UrlAllowlist([f"http://127.0.0.1:{port}/page.html"])
    with_proxy = EgressProxy(lambda: allowlist).start()
    try:
        sock, code = _connect(with_proxy, port)
        assert code == 0
        sock.sendall(b"GET /page.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b"<p>page</p>" in _read_all(sock)
        sock, code = _connect(with_proxy, port)  # the origin is allowed, this path is not: nothing is relayed
        sock.sendall(b"GET /secret.html HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_all(sock) == b""
        sock, code = _connect(with_proxy, port + 1 if port < 65535 else port - 1)  # another port
        assert code == 2
        sock, code = _connect(with_proxy, port, host=b"evil.example")
        assert code == 2
        sock, code = _connect(with_proxy, port, command=3)  # UDP ASSOCIATE: never
        assert code == 7
        sock, code = _connect(with_proxy, port)  # not HTTP, not TLS (e.g. STUN over TCP): refused
        sock.sendall(b"\x00\x01\x00\x00!\x12\xa4B" + b"\0" * 12)
        assert _read_all(sock) == b""
        assert seen == ["/page.html"]
        assert f"http://127.0.0.1:{port}/secret.html" in with_proxy.blocked
    finally:
        with_proxy.close()


def test_websocket_upgrades_are_checked_by_their_ws_url():
    probe = WebSocketProbe()
    allowlist = UrlAllowlist([f"ws://127.0.0.1:{probe.port}/ok"])
    proxy = EgressProxy(lambda: allowlist).start()
    upgrade = (b"GET %s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    try:
        sock, _ = _connect(proxy, probe.port)
        sock.sendall(upgrade % b"/ok")
        assert sock.recv(4096).startswith(b"HTTP/1.1 101")
        sock.close()
        sock, _ = _connect(proxy, probe.port)
        sock.sendall(upgrade % b"/other")
        assert _read_all(sock) == b""
        assert f"ws://127.0.0.1:{probe.port}/other" in proxy.blocked
    finally:
        proxy.close()
        probe.close()
