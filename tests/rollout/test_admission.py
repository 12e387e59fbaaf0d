"""Admission control: a worker's new group waits while (η + 1) batches are in flight or unconsumed, and only then."""

import threading
import time

import pytest

from jaxwebrl.rollout.admission import Admission


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def enter_in_thread(gate, worker, group):
    done = threading.Event()
    thread = threading.Thread(target=lambda: (gate.enter(worker, group), done.set()), daemon=True)
    thread.start()
    return done


def test_without_a_limit_nothing_waits():
    gate = Admission(group_size=4)
    for worker in range(10):
        gate.enter(worker, 1)
    assert gate.running() == 10


def test_groups_wait_for_capacity_and_go_when_the_trainer_consumes():
    gate = Admission(group_size=4)
    gate.set_limit(capacity=8, backlog=0)          # (η + 1) · B = 8 trajectories: two groups of 4
    gate.enter(0, 100)
    gate.enter(1, 200)
    third = enter_in_thread(gate, 2, 300)
    assert not third.wait(0.3)                      # 0 + 4 · 2 running is not < 8
    gate.enter(0, 100)                              # a further step of an admitted group never waits
    gate.set_limit(capacity=8, backlog=4)           # a third group's episodes read, not yet trained
    assert not third.wait(0.3)
    gate.set_limit(capacity=12, backlog=0)          # 0 + 4 · 2 < 12
    assert third.wait(2.0)
    assert gate.running() == 3


def test_a_waiting_worker_no_longer_counts_its_finished_group():
    """Every worker waiting for a new group must not block the others with its old one (no deadlock)."""
    gate = Admission(group_size=4)
    gate.set_limit(capacity=8, backlog=0)
    gate.enter(0, 1)
    gate.enter(1, 2)
    gate.set_limit(capacity=8, backlog=6)           # both groups done, 6 of their 8 kept (2 env-failed)
    first = enter_in_thread(gate, 0, 3)
    second = enter_in_thread(gate, 1, 4)
    assert first.wait(2.0) or second.wait(2.0)      # 6 + 0 running < 8: one of them goes


def test_silent_workers_stop_counting_after_ttl_and_close_wakes_everyone():
    clock = Clock()
    gate = Admission(group_size=4, ttl_s=60, clock=clock)
    gate.set_limit(capacity=4, backlog=0)
    gate.enter(0, 1)
    assert gate.running() == 1
    clock.now = 61.0                                 # worker 0 died mid-group
    assert gate.running() == 0
    gate.enter(1, 2)                                 # admitted without waiting
    waiting = enter_in_thread(gate, 2, 3)
    assert not waiting.wait(0.3)
    gate.close()
    assert waiting.wait(2.0)


def test_the_policy_server_gates_a_new_group(tmp_path):
    """Through PolicyServer.handle: a request naming a new group waits for set_admission, then is served."""
    import numpy as np

    from jaxwebrl.buffer.ring import RingBuffer
    from jaxwebrl.models.policy import tiny_policy
    from jaxwebrl.rollout.client import generate_request
    from jaxwebrl.rollout.policy_server import PolicyServer

    buffer = RingBuffer.create(str(tmp_path / "b"), capacity_steps=64, max_seq_len=256, screenshot_shape=(28, 28, 3),
                               max_images_per_step=1)
    ref = buffer.screenshots.put(np.zeros((28, 28, 3), np.uint8))
    server = PolicyServer(tiny_policy(seed=0), buffer, max_batch=2, group_size=2)
    try:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "go"}]}]
        server.set_admission(capacity=2, backlog=0)          # one group of 2 at a time
        request = lambda worker, group: generate_request(messages, [ref], max_new_tokens=4, group=(worker, group))
        assert len(server.handle(request(0, 7))["input_ids"]) > 0
        replies = []
        thread = threading.Thread(target=lambda: replies.append(server.handle(request(1, 8))), daemon=True)
        thread.start()
        time.sleep(0.5)
        assert not replies                                   # worker 0's group is still running
        server.set_admission(capacity=4, backlog=0)
        thread.join(timeout=60)
        assert replies and server.stats()["admission_wait_s"] >= 0.4
        with pytest.raises(Exception, match="worker_id"):
            server.handle(dict(request(0, 7), group_id="x"))
    finally:
        server.close()


def test_workers_held_by_admission_never_starve_a_running_group_of_its_steps():
    """A new group's request holds its transport handler thread while admission holds it (PolicyServer.handle). The
    service sized its handler threads by the trainer's own workers (2 a worker, at least 4), but workers that join by
    hand (launch/rollout.py, docs/scaling.md) connect too: with 5 of them held, a running group's next step found no
    thread, so its episode never ended, the trainer never consumed and nothing was admitted again (a deadlock, broken
    only by the clients' 600 s timeouts). Real transport and sockets; the handler gates as PolicyServer.handle does."""
    from jaxwebrl.rollout.serving import PolicyService
    from jaxwebrl.rollout.transport import TransportClient

    gate = Admission(group_size=1)
    gate.set_limit(capacity=1, backlog=0)                       # one group at a time

    def handle(request):
        gate.enter(request["worker_id"], request["group_id"])
        return {"served": request["worker_id"]}

    service = PolicyService(handle, num_clients=1).start()     # the trainer's own pool: one worker
    clients = [TransportClient(service.address, token=service.token, timeout_s=60) for _ in range(6)]
    try:
        assert clients[0].request({"worker_id": 0, "group_id": 1}) == {"served": 0}    # its group runs
        for worker in range(1, 6):                              # 5 joined workers ask for new groups: held
            threading.Thread(target=clients[worker].request, args=({"worker_id": worker, "group_id": 1},),
                             daemon=True).start()
        deadline = time.monotonic() + 30
        while sum(t.name.startswith("transport-handler") for t in threading.enumerate()) < 4:
            assert time.monotonic() < deadline, "the joined workers' requests never reached the handler"
            time.sleep(0.05)
        time.sleep(0.5)                                         # the fifth too, where a thread can take it
        assert clients[0].request({"worker_id": 0, "group_id": 1}, timeout_s=5) == {"served": 0}  # its next step
    finally:
        gate.close()
        for client in clients:
            client.close()
        service.close()


def test_a_request_its_client_gave_up_on_leaves_when_the_worker_asks_again():
    """A worker's client times out (600 s) while admission holds its new group, and it asks again. The first
    request used to wait on beside the second: each timeout held one more handler thread (the service has 2 a
    worker), and once admitted both were decoded, the first for nobody."""
    gate = Admission(group_size=2)
    gate.set_limit(capacity=2, backlog=0)
    gate.enter(0, 1)                                 # worker 0's group fills the capacity
    outcome = []

    def first_request():
        try:
            gate.enter(1, 7)
            outcome.append("admitted")
        except Exception as err:  # noqa: BLE001 - the test reads what it was
            outcome.append(err)

    thread = threading.Thread(target=first_request, daemon=True)
    thread.start()
    time.sleep(0.3)
    assert not outcome                               # held: worker 0's group runs
    retry = enter_in_thread(gate, 1, 7)              # its client timed out: the worker asks again
    thread.join(timeout=2.0)
    assert outcome and "superseded by its newer request" in str(outcome[0])
    assert not retry.wait(0.3)                       # the retry waits in its place, alone
    gate.set_limit(capacity=4, backlog=0)
    assert retry.wait(2.0) and gate.running() == 2
