"""pyzmq transport: array round trip, concurrent clients, token auth, errors, timeouts."""

import threading
import time

import numpy as np
import pytest
import zmq

from jaxwebrl.rollout.transport import TransportClient, TransportServer, new_token
from jaxwebrl.rollout.wire import (TransportAuthError, TransportError, TransportTimeout, decode_message,
                                   encode_message)


@pytest.fixture
def token():
    return new_token()


def echo(request):
    return {"echo": request}


def test_round_trip_keeps_dtypes_shapes_and_values(token):
    payload = {
        "ids": np.arange(7, dtype=np.int32),
        "mask": np.array([True, False, True]),
        "logp": np.linspace(-3, 0, 6, dtype=np.float32).reshape(2, 3),
        "half": np.ones((2, 2), np.float16),
        "pixels": np.random.default_rng(0).integers(0, 255, (4, 5, 3), dtype=np.uint8),
        "big_endian": np.arange(4, dtype=">i8"),
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 3), np.int64),
        "nested": {"list": [np.int64(5), {"a": np.arange(2, dtype=np.uint16)}], "text": "héllo", "none": None},
    }
    with TransportServer(echo, token=token) as server:
        assert server.address.startswith("tcp://127.0.0.1:")
        with TransportClient(server.address, token=token) as client:
            got = client.request(payload)["echo"]
    for key in ("ids", "mask", "logp", "half", "pixels", "scalar", "empty"):
        assert got[key].dtype == payload[key].dtype and got[key].shape == payload[key].shape, key
        np.testing.assert_array_equal(got[key], payload[key])
    np.testing.assert_array_equal(got["big_endian"], np.arange(4))
    assert got["big_endian"].dtype == np.int64
    assert got["nested"]["list"][0] == 5 and got["nested"]["list"][1]["a"].dtype == np.uint16
    assert got["nested"]["text"] == "héllo" and got["nested"]["none"] is None
    got["ids"][0] = 99  # decoded arrays are writable copies


def test_unsendable_values_are_refused_before_sending():
    with pytest.raises(TypeError, match="payload.obj: array dtype object"):
        encode_message({}, {"obj": np.array([object()])})
    with pytest.raises(TypeError, match="dict key 3"):
        encode_message({}, {"d": {3: 1}})
    with pytest.raises(TypeError, match="payload.f: value of type function"):
        encode_message({}, {"f": echo})
    with pytest.raises(TransportError, match="does not match"):
        frames = encode_message({}, {"a": np.arange(3)})
        decode_message([frames[0], b"\x00" * 5])
    with pytest.raises(TransportError, match="not jaxwebrl-transport"):
        decode_message([b'{"protocol": "other"}'])
    with pytest.raises(TransportError, match="bad array marker"):  # was an IndexError that killed the server
        decode_message([b'{"protocol": "jaxwebrl-transport/2", "payload": {"a": {"__ndarray__": 7}}}'])


def test_wrong_token_is_refused_and_the_server_goes_on(token):
    with TransportServer(echo, token=token) as server:
        with TransportClient(server.address, token="not-the-token") as bad:
            with pytest.raises(TransportAuthError, match="wrong token") as refused:
                bad.request({"x": 1})
            # the fix names keys that exist (config.rollout.transport_token does not)
            assert "policy.token" in str(refused.value) and "JAXWEBRL_TOKEN" in str(refused.value)
            assert "transport_token" not in str(refused.value)
        with TransportClient(server.address, token=token) as good:
            assert good.request({"x": 2}) == {"echo": {"x": 2}}
        assert server.requests_refused >= 1 and server.requests_served == 1
    with pytest.raises(ValueError, match="non-empty string"):
        TransportServer(echo, token="")
    with pytest.raises(ValueError, match="non-empty string"):
        TransportClient("tcp://127.0.0.1:1", token=None)


def test_curve_encrypts_and_the_token_still_authorizes(token):
    public, secret = zmq.curve_keypair()
    with TransportServer(echo, token=token, curve_secret_key=secret) as server:
        with TransportClient(server.address, token=token, server_key=public) as good:
            assert good.request({"x": np.arange(3)})["echo"]["x"].tolist() == [0, 1, 2]
        with TransportClient(server.address, token="not-the-token", server_key=public) as bad:
            with pytest.raises(TransportAuthError, match="wrong token"):   # knows the server key, not the token
                bad.request({"x": 1})
        with TransportClient(server.address, token=token, timeout_s=2.0) as plain:   # PLAIN against CURVE
            with pytest.raises(TransportError):
                plain.request({"x": 1})
        assert server.requests_served == 1 and server.requests_refused >= 1
    with pytest.raises(ValueError, match="server_key must be a CurveZMQ key"):
        TransportClient("tcp://127.0.0.1:1", token=token, server_key="short")
    with pytest.raises(ValueError, match="curve_secret_key must be a CurveZMQ key"):
        TransportServer(echo, token=token, curve_secret_key=b" " * 40)


def test_many_concurrent_clients_are_served_in_parallel_and_routed_right(token):
    active, peak, lock = [0], [0], threading.Lock()

    def slow_handler(request):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return {"client": request["client"], "double": request["values"] * 2}

    errors = []

    def run_client(address, index):
        try:
            with TransportClient(address, token=token, timeout_s=30) as client:
                for i in range(10):
                    values = np.full(3, index * 100 + i, np.int64)
                    reply = client.request({"client": index, "values": values})
                    assert reply["client"] == index
                    np.testing.assert_array_equal(reply["double"], values * 2)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    with TransportServer(slow_handler, token=token, num_threads=8) as server:
        threads = [threading.Thread(target=run_client, args=(server.address, k)) for k in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert server.requests_served == 120
    assert not errors, errors
    assert peak[0] > 1  # a batching backend sees concurrent requests


def test_handler_errors_and_timeouts_do_not_poison_the_connection(token):
    def handler(request):
        if request.get("fail"):
            raise KeyError("no such screenshot ref 7")
        time.sleep(request.get("sleep", 0))
        return {"n": request["n"]}

    with TransportServer(handler, token=token) as server, TransportClient(server.address, token=token) as client:
        with pytest.raises(TransportError, match="failed \\(handler\\): KeyError.*no such screenshot ref 7"):
            client.request({"fail": True})
        with pytest.raises(TransportTimeout, match="no reply from the policy server"):
            client.request({"n": 1, "sleep": 0.5}, timeout_s=0.1)
        time.sleep(0.5)  # the late reply to n=1 arrives now and must be skipped
        assert client.request({"n": 2}) == {"n": 2}


def test_server_reports_a_port_in_use(token):
    with TransportServer(echo, token=token) as first:
        port = int(first.address.rsplit(":", 1)[1])
        with pytest.raises(OSError, match="cannot bind"):
            TransportServer(echo, token=token, port=port).start()
