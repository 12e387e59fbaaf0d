"""Loopback servers that watch what leaves a browser (the doctor's allowlist check and the tests use them):
an HTTP directory server, a WebSocket server that greets and records, and a UDP socket that counts packets.
They ship in the package, not under tests/, because the doctor (`python -m jaxwebrl.env.check`) needs them.

    server, url, paths = serve_directory(root)     # http://127.0.0.1:PORT, every path requested
    ws = WebSocketProbe()                          # ws.url; ws.connections, ws.messages (text frames received)
    udp = UdpProbe()                               # udp.port; udp.packets (e.g. STUN binding requests)
    ...; ws.close(); udp.close()
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import socket
import threading

_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
GREETING = "hello from the websocket server"


def serve_directory(root: str):
    """A quiet http.server on 127.0.0.1 (a free port) in a daemon thread; returns (server, base URL, paths seen)."""
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            seen.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=root))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", seen


class WebSocketProbe:
    """A minimal RFC 6455 server on 127.0.0.1: completes the handshake, sends GREETING, records the text frames
    it receives (short unfragmented frames: what the probes' pages send)."""

    def __init__(self):
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"ws://127.0.0.1:{self.port}"
        self.connections = 0
        self.messages: list[str] = []
        threading.Thread(target=self._accept, name="ws-probe", daemon=True).start()

    def close(self) -> None:
        _close_waking(self._sock)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                key = next((line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                            if line.lower().startswith(b"sec-websocket-key:")), None)
                if key is None:
                    return
                accept = base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
                greeting = GREETING.encode()
                conn.sendall(bytes([0x81, len(greeting)]) + greeting)
                self._read_frames(conn)
            except OSError:
                return

    def _read_frames(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                return
            buffer += chunk
            while len(buffer) >= 6:
                opcode, length = buffer[0] & 0x0F, buffer[1] & 0x7F
                if length >= 126 or len(buffer) < 6 + length:
                    break
                mask, payload = buffer[2:6], buffer[6:6 + length]
                buffer = buffer[6 + length:]
                if opcode == 0x8:  # close
                    return
                if opcode == 0x1:
                    self.messages.append(bytes(b ^ mask[i % 4] for i, b in enumerate(payload)).decode(errors="replace"))


class UdpProbe:
    """A UDP socket on 127.0.0.1 that counts the datagrams it receives (a STUN or QUIC port)."""

    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.packets = 0
        threading.Thread(target=self._count, name="udp-probe", daemon=True).start()

    def close(self) -> None:
        _close_waking(self._sock)

    def _count(self) -> None:
        while True:
            try:
                self._sock.recvfrom(65536)
            except OSError:
                return
            self.packets += 1


def _close_waking(sock: socket.socket) -> None:
    """Close `sock` and wake the probe thread blocked on it (a plain close leaves accept/recv waiting on Linux)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:   # not connected (UDP) or already shut
        pass
    sock.close()
