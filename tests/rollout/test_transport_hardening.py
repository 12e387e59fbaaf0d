"""The transport against a hostile peer: messages that used to kill the server, a fuzz of thousands of random
frames, JSON and handshake bytes against a live server (which still serves a real request afterwards), the
unauthenticated memory-amplification attack (peak RSS of a server process), and a dead serve thread that
must be reported instead of leaving workers waiting."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxwebrl.rollout import transport, wire
from jaxwebrl.rollout.transport import TransportClient, TransportServer, new_token
from jaxwebrl.rollout.wire import TransportError

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(transport.__file__))))
MiB = 1 << 20


def echo(request):
    return {"echo": request}


def _head(payload, arrays=(), **extra) -> bytes:
    return json.dumps({"protocol": wire.PROTOCOL, "id": 1, "payload": payload, "arrays": list(arrays),
                       **extra}).encode()


def _raw_reply(sock, timeout_ms=10_000):
    """The header of the next reply on a raw DEALER socket, or None when none came."""
    if not sock.poll(timeout_ms):
        return None
    return json.loads(sock.recv_multipart()[0])


KILLERS = {
    "array marker out of range": [_head({"a": {"__ndarray__": 7}})],  # 90 bytes that used to end the server
    "negative array marker": [_head({"a": {"__ndarray__": -1}})],
    "array marker not an int": [_head({"a": {"__ndarray__": "x"}})],
    "array marker with company": [_head({"a": {"__ndarray__": 0, "b": 1}}, [{"dtype": "<i4", "shape": [1]}]),
                                  b"\0" * 4],
    "nested 100k deep": [b'{"protocol": "%s", "payload": ' % wire.PROTOCOL.encode() + b"[" * 100_000],
    "nested below the JSON limit": [_head(json.loads("[" * 500 + "]" * 500))],
    "object dtype": [_head({}, [{"dtype": "|O", "shape": [1]}]), b"\0" * 8],
    "structured dtype": [_head({}, [{"dtype": [["a", "<i4"]], "shape": [1]}]), b"\0" * 4],
    "negative shape": [_head({}, [{"dtype": "<i4", "shape": [-1]}]), b""],
    "shape of strings": [_head({}, [{"dtype": "<i4", "shape": ["1"]}]), b"\0" * 4],
    "huge shape": [_head({}, [{"dtype": "<i8", "shape": [2**62, 2**62]}]), b"\0" * 8],
    "arrays not a list": [json.dumps({"protocol": wire.PROTOCOL, "payload": {}, "arrays": 5}).encode()],
    "payload a list": [_head([1, 2])],
    "header a list": [b"[1, 2, 3]"],
    "header not UTF-8": [b"\xff\xfe\x00garbage"],
    "integer of 10k digits": [b'{"protocol": "%s", "id": %s}' % (wire.PROTOCOL.encode(), b"9" * 10_000)],
    "frame count mismatch": [_head({}), b"extra", b"frames"],
}


@pytest.mark.parametrize("frames", list(KILLERS.values()), ids=list(KILLERS))
def test_a_malformed_message_gets_an_error_reply_and_the_server_goes_on(frames):
    token = new_token()
    with TransportServer(echo, token=token) as server, TransportClient(server.address, token=token,
                                                                       timeout_s=10) as client:
        client._socket.send_multipart(frames)  # an authenticated peer that sends junk
        reply = _raw_reply(client._socket)
        assert reply is not None and reply["ok"] is False and reply["error_kind"] == "protocol", reply
        assert client.request({"n": 1}) == {"echo": {"n": 1}}
        assert server.alive


@pytest.mark.parametrize("frames", list(KILLERS.values()), ids=list(KILLERS))
def test_decode_message_refuses_every_malformed_message_as_a_transport_error(frames):
    """What a client decodes goes through no server's catch-all: a reply whose array spec names a list or dict as its
    dtype raised TypeError ('unhashable type'), which a worker does not handle as a policy server failure."""
    with pytest.raises(TransportError):
        wire.decode_message(frames)


def test_a_message_over_the_size_limit_as_a_whole_is_refused():
    token = new_token()
    with TransportServer(echo, token=token, max_message_bytes=1 * MiB) as server, \
            TransportClient(server.address, token=token, timeout_s=10) as client:
        chunk = np.zeros(600 * 1024, np.uint8)  # each frame is under the limit, the message is not
        client._socket.send_multipart(wire.encode_message({"id": 1}, {"a": chunk, "b": chunk}))
        reply = _raw_reply(client._socket)
        assert reply["ok"] is False and "exceeds the limit" in reply["error"]
        assert client.request({"a": chunk})["echo"]["a"].shape == chunk.shape
        assert server.requests_malformed == 1


def _json_values():
    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
    keys = st.text(max_size=6) | st.just(wire.ARRAY_MARKER)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                        max_leaves=16)


def _messages():
    values = _json_values()
    dtypes = st.sampled_from(sorted(wire._WIRE_DTYPES) + [">i4", "|O", "<U4", "|V8", "(2,)<i4"])
    spec = st.fixed_dictionaries({"dtype": dtypes | values, "shape": st.lists(st.integers(-2, 6), max_size=3) | values})
    header = st.fixed_dictionaries({
        "protocol": st.just(wire.PROTOCOL) | st.text(max_size=4),
        "id": values, "payload": values | st.dictionaries(st.text(max_size=4), values, max_size=3),
        "arrays": st.lists(spec, max_size=3) | values})
    frames = st.lists(st.binary(max_size=48), max_size=3)
    return st.one_of(
        st.lists(st.binary(max_size=96), min_size=1, max_size=4),                      # random frames
        st.tuples(header, frames).map(lambda hf: [json.dumps(hf[0]).encode()] + hf[1]),  # random JSON headers
        st.integers(1, 20_000).map(lambda d: [b"[" * d + b"]" * (d % 3)]),             # deep nesting
        st.tuples(st.integers(0, 3), st.integers(1, 4)).map(                             # big frames
            lambda nk: [_head({}, [{"dtype": "|u1", "shape": [nk[1] * 100_000]}] * nk[0])]
            + [b"\0" * (nk[1] * 100_000)] * nk[0]),
    )


def _zmtp_greeting(mechanism: bytes) -> bytes:
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0" + b"\0" * 31


def test_fuzz_thousands_of_random_messages_then_a_real_request_is_served():
    token = new_token()
    rng = np.random.default_rng(0)
    outcomes = {"error": 0, "ok": 0}
    with TransportServer(echo, token=token, max_message_bytes=1 * MiB) as server, \
            TransportClient(server.address, token=token, timeout_s=10) as client:
        sock = client._socket

        @settings(max_examples=1500, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(_messages())
        def every_message_gets_a_reply(frames):
            sock.send_multipart(frames)
            reply = _raw_reply(sock)
            assert reply is not None, f"no reply to {[f[:60] for f in frames]}"
            outcomes["ok" if reply["ok"] else "error"] += 1

        every_message_gets_a_reply()
        for _ in range(2000):  # plain random bytes, 1..3 frames
            sock.send_multipart([rng.bytes(int(rng.integers(0, 200))) for _ in range(int(rng.integers(1, 4)))])
            assert _raw_reply(sock)["ok"] is False
        port = int(server.address.rsplit(":", 1)[1])
        for i in range(200):  # unauthenticated handshake bytes: garbage, and a PLAIN greeting + a 2^60-byte frame
            with socket.create_connection(("127.0.0.1", port)) as raw:
                raw.sendall(rng.bytes(int(rng.integers(1, 300))) if i % 2 else
                            _zmtp_greeting(b"PLAIN") + b"\x06" + (2**60).to_bytes(8, "big") + b"x" * 100)
        with TransportClient(server.address, token=token) as other:  # frames over the per-frame limit: libzmq
            for size in (1 * MiB + 1, 3 * MiB, 8 * MiB):                 # drops that peer, nothing is buffered
                other._socket.send_multipart([_head({}), b"\0" * size])
            assert _raw_reply(other._socket, 1000) is None
        sock.send_multipart([_head({"a": {"__ndarray__": 7}})])  # one more killer, after all that
        assert _raw_reply(sock)["ok"] is False
        assert client.request({"x": np.arange(3)})["echo"]["x"].tolist() == [0, 1, 2]
        assert server.alive
    assert outcomes["error"] > 1000 and sum(outcomes.values()) == 1500


SERVER_PROCESS = """
import resource, sys
from jaxwebrl.rollout.transport import TransportServer
def handler(request):
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
with TransportServer(handler, token=sys.argv[1]) as server:
    print(server.address, flush=True)
    sys.stdin.readline()
"""


def _attack(address: str, frame_bytes: int, frames: int, password: bytes | None) -> None:
    """Send one message of `frames` frames of `frame_bytes` each with a wrong token; return once the server
    answered it (an old server decodes, then refuses) or refused the connection (the handshake failed)."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if password is not None:
        sock.setsockopt(zmq.PLAIN_USERNAME, b"attacker")
        sock.setsockopt(zmq.PLAIN_PASSWORD, password)
    monitor = sock.get_monitor_socket()
    sock.connect(address)
    blob = np.zeros(frame_bytes, np.uint8)
    head = json.dumps({"protocol": wire.PROTOCOL, "id": 1, "token": "wrong", "payload": {},
                       "arrays": [{"dtype": "|u1", "shape": [frame_bytes]}] * frames}).encode()
    sock.send_multipart([head] + [memoryview(blob)] * frames, copy=False)
    from zmq.utils.monitor import recv_monitor_message

    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    deadline = time.monotonic() + 60
    done = False
    while not done and time.monotonic() < deadline:
        events = dict(poller.poll(1000))
        if sock in events:
            done = True
        if monitor in events:
            event = recv_monitor_message(monitor)["event"]
            done = event in (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                             zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED)
    sock.disable_monitor()
    monitor.close(0)
    sock.close(0)
    context.term()
    assert done, "the attack got neither a reply nor a refused handshake"


def test_wrong_token_peers_cannot_make_the_server_hold_their_payload():
    """4 x 200 MB frames with a wrong token (the issue's attack) used to peak the server at 1.63 GB."""
    token = new_token()
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", SERVER_PROCESS, token], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        with TransportClient(address, token=token, timeout_s=60) as client:
            before = client.request({})["peak_rss"]
            for password in (None, b"wrong-token"):  # no credentials at all, and a wrong token
                _attack(address, 200 * MiB, 4, password)
            after = client.request({})["peak_rss"]
            rss_now = psutil.Process(proc.pid).memory_info().rss
        growth = after - before
        assert growth < 64 * MiB, f"server peak RSS grew by {growth / MiB:.0f} MiB (now {rss_now / MiB:.0f} MiB)"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_dead_serve_thread_is_reported_and_waiting_clients_hear_at_once():
    token = new_token()
    entered, release = threading.Event(), threading.Event()

    def slow(request):
        entered.set()
        release.wait(30)
        return {}

    server = TransportServer(slow, token=token).start()
    errors = []

    def waiting_worker():
        with TransportClient(server.address, token=token, timeout_s=120) as client:
            try:
                client.request({"n": 1})
            except TransportError as exc:
                errors.append(exc)

    worker = threading.Thread(target=waiting_worker)
    worker.start()
    assert entered.wait(30)

    class Fatal(BaseException):
        """Something no `except Exception` catches."""

    def die(*args):
        raise Fatal("simulated fault in the serve thread")

    server._serve_once = die
    os.write(server._wake_write, b"x")
    worker.join(timeout=60)
    release.set()
    try:
        assert not worker.is_alive()
        assert len(errors) == 1 and "lost the connection" in str(errors[0]), errors
        assert not isinstance(errors[0], wire.TransportTimeout)
        with pytest.raises(RuntimeError, match=r"policy server transport at tcp://.* stopped: Fatal: simulated") as err:
            server.raise_if_failed()
        assert "\n" not in str(err.value)
    finally:
        server.close()


def test_a_dead_serve_thread_is_recorded_before_any_client_hears_of_it():
    """The race of issue 32, made deterministic: the serve thread is held between its death and closing its
    sockets. A supervisor polling raise_if_failed in that window must already see the failure (it used to be
    recorded only after the close, so CI under load saw a client told "lost the connection" by a healthy server)."""
    token = new_token()
    entered, release = threading.Event(), threading.Event()
    closing, checked = threading.Event(), threading.Event()

    def slow(request):
        entered.set()
        release.wait(30)
        return {}

    server = TransportServer(slow, token=token).start()
    close_sockets = server._close_sockets

    def held_close(*args):   # the window between "the thread died" and "clients hear of it"
        closing.set()
        checked.wait(30)
        close_sockets(*args)

    server._close_sockets = held_close
    errors = []

    def waiting_worker():
        with TransportClient(server.address, token=token, timeout_s=120) as client:
            try:
                client.request({"n": 1})
            except TransportError as exc:
                errors.append(exc)

    worker = threading.Thread(target=waiting_worker)
    worker.start()
    try:
        assert entered.wait(30)

        class Fatal(BaseException):
            """Something no `except Exception` catches."""

        def die(*args):
            raise Fatal("simulated fault in the serve thread")

        server._serve_once = die
        os.write(server._wake_write, b"x")
        assert closing.wait(30)
        assert worker.is_alive() and not errors   # no client told anything yet...
        with pytest.raises(RuntimeError, match=r"stopped: Fatal: simulated fault"):
            server.raise_if_failed()              # ...and the supervisor already knows
    finally:
        checked.set()
        worker.join(timeout=60)
        release.set()
        server.close()
    assert len(errors) == 1 and "lost the connection" in str(errors[0]), errors


def test_a_client_with_no_server_says_so_while_it_waits(monkeypatch, caplog):
    monkeypatch.setattr(transport, "NOT_CONNECTED_WARNING_MS", 100)
    with socket.socket() as placeholder:  # a port where nothing listens
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with TransportClient(f"tcp://127.0.0.1:{port}", token=new_token(), timeout_s=1.0) as client:
        with pytest.raises(wire.TransportTimeout):
            client.request({})
    assert any("still no connection to the policy server" in r.getMessage() for r in caplog.records)
