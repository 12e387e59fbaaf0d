"""The policy server's batching thread on the tiny Qwen3-VL: a malformed request fails alone (not the batch it
would have joined), and a thread that dies is reported at once to every waiting handler and to the run."""

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.rollout.continuous_server import ContinuousPolicyServer
from jaxwebrl.rollout.policy_server import PolicyServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    buffer = RingBuffer.create(str(tmp_path_factory.mktemp("buf") / "buffer"), capacity_steps=256, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    ref = buffer.screenshots.put(np.zeros((64, 64, 3), np.uint8))
    server = PolicyServer(tiny_policy(seed=1), buffer, max_batch=4, deadline_ms=200, decode_chunk=4)
    server.good_request = {
        "op": "generate", "image_refs": np.array([ref]), "max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0,
        "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "go"}]}]}
    yield server
    server.close()


@pytest.mark.parametrize("patch, message", [
    ({"op": "train"}, "ops 'generate' and 'judge' only"),
    ({"max_new_tokens": None}, "'max_new_tokens' must be an int >= 1"),
    ({"max_new_tokens": "8"}, "'max_new_tokens' must be an int >= 1"),
    ({"temperature": float("nan")}, "'temperature' must be a finite number >= 0"),
    ({"temperature": -1.0}, "'temperature' must be a finite number >= 0"),
    ({"top_p": 1.5}, "'top_p' must be a number in"),
    ({"image_refs": [1, 2]}, "'image_refs' must be an int array"),
    ({"messages": "hello"}, "'messages' must be a list"),
    ({"seed": 2**40}, "'seed' must be None or an int in"),
    ({"seed": -1}, "'seed' must be None or an int in"),
])
def test_a_malformed_request_fails_alone(server, patch, message):
    results = {}

    def good():
        results["good"] = server.handle(dict(server.good_request))

    thread = threading.Thread(target=good)
    thread.start()  # a good request waits for its batch (deadline 200 ms) while the bad one arrives
    with pytest.raises(ValueError, match=message):
        server.handle({**server.good_request, **patch})
    thread.join(timeout=120)
    assert len(results["good"]["input_ids"]) > 4


def test_a_batch_still_decoding_counts_its_busy_time_up_to_the_read(server, monkeypatch):
    """stats()["busy_s"] includes the batch being decoded, so the busy time a bench reads over its window is never
    time from before the window (a fraction above 1 when a batch ended just after the window opened)."""
    entered, release = threading.Event(), threading.Event()
    generate = server._sampler.generate

    def slow_generate(*args, **kw):
        entered.set()
        release.wait(timeout=60)
        return generate(*args, **kw)

    monkeypatch.setattr(server._sampler, "generate", slow_generate)
    thread = threading.Thread(target=server.handle, args=(dict(server.good_request),))
    thread.start()
    assert entered.wait(timeout=60)
    time.sleep(0.3)                       # the batch has been busy 0.3 s before the window opens
    before, opened = server.stats()["busy_s"], time.monotonic()
    release.set()
    thread.join(timeout=120)
    busy, window = server.stats()["busy_s"] - before, time.monotonic() - opened
    assert 0 < busy <= window


@pytest.mark.parametrize("bad", ["verdict", "screenshot", "verdict_decode"])
def test_a_request_that_cannot_be_encoded_fails_alone_not_the_batch_it_joined(server, bad, monkeypatch):
    """Static batches: a verdict whose screenshot the image processor refuses (aspect ratio 300), a request whose
    screenshot is not in the store, or a verdict whose setting's decode raises, is failed alone; the worker's request
    decoded in the same batch is answered."""
    from jaxwebrl.env.tasks.webgym.judge import JudgeRequest
    from jaxwebrl.rollout.engine_judge import judge_payload

    if bad.startswith("verdict"):
        shape = (1, 300, 3) if bad == "verdict" else (64, 64, 3)
        request = judge_payload(JudgeRequest("t", "goal", ("fact",), "answer",
                                             screenshots=(np.zeros(shape, np.uint8),)), (0,))
        server._verdicts.decoding(1, False, True)   # built before: the verdict reaches the queue at once
        generate = server._sampler.generate

        def failing_verdicts(*args, constraint=None, **kw):
            if constraint is not None:
                raise RuntimeError("the verdict setting's decode failed")
            return generate(*args, constraint=constraint, **kw)

        monkeypatch.setattr(server._sampler, "generate", failing_verdicts)
    else:
        request = dict(server.good_request, image_refs=np.array([12345]))
    results = {}

    def ask(name, payload):
        try:
            results[name] = server.handle(payload)
        except Exception as exc:  # noqa: BLE001 - recorded for the asserts
            results[name] = exc

    server.pause()
    time.sleep(0.3)   # the batching thread waits for resume() before it takes a request
    threads = [threading.Thread(target=ask, args=args) for args in (("good", dict(server.good_request)),
                                                                     ("bad", request))]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while server._requests.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.resume()   # both are queued: they make one batch
    for thread in threads:
        thread.join(timeout=120)
    assert isinstance(results["bad"], Exception) and "policy server" not in str(results["bad"])
    assert isinstance(results["good"], dict), results["good"]
    assert len(results["good"]["input_ids"]) > 4
    server.raise_if_failed()


def test_a_dead_batching_thread_fails_waiting_requests_and_the_run(tmp_path):
    buffer = RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=256, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    taken = threading.Event()

    class Fatal(BaseException):
        """Not an Exception: escapes the per-batch handler, ends the thread."""

    class DyingServer(PolicyServer):
        def _next_batch(self):
            item = self._requests.get(timeout=60)  # a request arrived; the thread dies before answering it
            self._requests.put(item)
            taken.set()
            raise Fatal("simulated fault in the batching thread")

    server = DyingServer(tiny_policy(seed=1), buffer, max_batch=2, deadline_ms=1)
    request = {"op": "generate", "image_refs": np.array([0]), "max_new_tokens": 4,
               "messages": [{"role": "user", "content": [{"type": "image"}]}]}
    try:
        with pytest.raises(RuntimeError, match="policy server stopped: Fatal: simulated fault"):
            server.handle(request)  # queued before the thread died: failed, not left waiting
        assert taken.is_set()
        with pytest.raises(RuntimeError, match="policy server stopped: Fatal"):
            server.handle(request)  # after: refused at once
        with pytest.raises(RuntimeError, match="^policy server stopped: Fatal: simulated fault in the batching "
                                               "thread$"):
            server.raise_if_failed()
    finally:
        server.close()


def test_a_dead_batching_thread_is_recorded_before_any_waiting_request_hears_of_it(tmp_path):
    """The issue-32 audit: a future's callback runs in the thread that settles it, at that moment, so it sees
    exactly what a supervisor polling raise_if_failed would see when the first waiting worker is told."""
    buffer = RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=256, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)

    class Fatal(BaseException):
        """Not an Exception: escapes the per-batch handler, ends the thread."""

    queued = threading.Event()

    class DyingServer(PolicyServer):
        def _next_batch(self):
            queued.wait(60)
            raise Fatal("simulated fault in the batching thread")

    server = DyingServer(tiny_policy(seed=1), buffer, max_batch=2, deadline_ms=1)
    seen = []

    def when_told(future):
        try:
            server.raise_if_failed()
            seen.append("healthy")
        except RuntimeError as err:
            seen.append(str(err))

    future = concurrent.futures.Future()
    future.add_done_callback(when_told)
    try:
        server._requests.put(({"op": "generate"}, future, 0.0))   # a request waiting when the thread dies
        queued.set()
        with pytest.raises(RuntimeError, match="policy server stopped: Fatal"):
            future.result(timeout=60)
    finally:
        server.close()
    assert seen == ["policy server stopped: Fatal: simulated fault in the batching thread"]


def test_a_clean_shutdown_with_requests_in_flight_logs_no_traceback(tmp_path, caplog):
    """Shut down as the supervisor does (transport, then policy server) while two workers' requests wait in a
    paused server (sync mode): one held in a batch, one queued. The queued one's handler is failed, quietly."""
    import logging

    from jaxwebrl.rollout.transport import TransportClient, TransportServer, new_token
    from jaxwebrl.rollout.wire import TransportError

    buffer = RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=256, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    ref = buffer.screenshots.put(np.zeros((64, 64, 3), np.uint8))
    server = PolicyServer(tiny_policy(seed=1), buffer, max_batch=1, deadline_ms=1)
    server.pause()
    token = new_token()
    transport = TransportServer(server.handle, token=token).start()
    errors = []

    def worker():
        with TransportClient(transport.address, token=token, timeout_s=60) as client:
            try:
                client.request({"op": "generate", "image_refs": np.array([ref]), "max_new_tokens": 4,
                                "messages": [{"role": "user", "content": [{"type": "image"}]}]})
            except TransportError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    caplog.set_level(logging.DEBUG, logger="jaxwebrl")
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while server._requests.qsize() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server._requests.qsize() == 1  # one request held in a batch by the paused server, one queued
    transport.close()
    server.close()
    for thread in threads:
        thread.join(timeout=60)
    assert len(errors) == 2  # both workers heard that the server went away
    tracebacks = [r for r in caplog.records if r.exc_info and r.levelno >= logging.INFO]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("jaxwebrl")]


def test_a_refused_request_reaches_the_client_as_refused_not_as_a_retryable_failure():
    """A handler's RequestRefused (the request itself is wrong) comes back as TransportRequestRefused, which
    workers do not retry; any other handler failure stays a plain, retryable TransportError. (An eval run once
    retried a refused greedy request forever.)"""
    from jaxwebrl.rollout.transport import (RequestRefused, TransportClient, TransportError, TransportRequestRefused,
                                            TransportServer, new_token)

    def handler(request):
        if request["kind"] == "refuse":
            raise RequestRefused("bad field")
        raise ValueError("transient")

    token = new_token()
    server = TransportServer(handler, token=token).start()
    client = TransportClient(server.address, token=token, timeout_s=30)
    try:
        with pytest.raises(TransportRequestRefused, match="bad field"):
            client.request({"kind": "refuse"})
        with pytest.raises(TransportError, match="transient") as info:
            client.request({"kind": "other"})
        assert not isinstance(info.value, TransportRequestRefused)
    finally:
        client.close()
        server.close()


def test_continuous_server_fails_an_unreadable_request_alone_and_what_waits_at_close(tmp_path):
    """Continuous batching: a request whose screenshot cannot be read fails alone (the server goes on), and close()
    fails at once the requests it had taken off the queue but not admitted (paused: none is decoded)."""
    buffer = RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=256, max_seq_len=512,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    server = ContinuousPolicyServer(tiny_policy(seed=1), buffer, max_batch=2, decode_chunk=4)
    request = {"op": "generate", "image_refs": np.array([12345]), "max_new_tokens": 4,
               "messages": [{"role": "user", "content": [{"type": "image"}]}]}
    errors = []
    try:
        with pytest.raises(Exception) as unreadable:
            server.handle(dict(request))
        assert "policy server" not in str(unreadable.value)   # the screenshot store's own error, not a dead server
        server.raise_if_failed()
        server.pause()

        def ask():
            try:
                server.handle(dict(request))
            except RuntimeError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=ask) for _ in range(2)]
        queued = server._requests.unfinished_tasks   # counts every put, taken off the queue or not
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while server._requests.unfinished_tasks - queued + len(errors) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)   # the batching thread takes them off the queue and holds them (paused)
    finally:
        server.close()
    for thread in threads:
        thread.join(timeout=10)
    assert errors == ["policy server closed"] * 2
