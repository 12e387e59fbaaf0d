"""EnvHost: one env thread per worker, LRU closing, and a hung call that resets everything."""

import threading

import pytest

from jaxwebrl.env.base import EnvTimeout
from jaxwebrl.env.tasks.toy.toy import ToyEnv
from jaxwebrl.rollout.env_host import EnvHost, task_name


class RecordingToy(ToyEnv):
    def __init__(self, log, name):
        super().__init__()
        self.log, self.name = log, name
        self.closed = threading.Event()
        log.append(("create", name, threading.get_ident()))

    def reset(self, seed):
        self.log.append(("reset", self.name, threading.get_ident()))
        if seed == -1:
            self.closed.wait(30)  # hang until closed (as a killed browser would end the call)
        return super().reset(seed)

    def close(self):
        self.log.append(("close", self.name, threading.get_ident()))
        self.closed.set()


def test_every_call_runs_on_one_thread_and_lru_envs_are_closed_there():
    log = []
    host = EnvHost(lambda spec, browser: RecordingToy(log, spec), timeout_s=5, max_open_envs=2)
    for task in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" arrives
        env = host.get(task)
        host.call(lambda: env.reset(0), "reset")
    host.close()
    assert [(kind, name) for kind, name, _ in log if kind != "reset"] == [
        ("create", "a"), ("create", "b"), ("close", "b"), ("create", "c"), ("close", "a"), ("close", "c")]
    assert len({thread for _, _, thread in log}) == 1 and log[0][2] != threading.get_ident()


def test_a_hung_call_times_out_closes_everything_and_the_host_goes_on():
    log = []
    host = EnvHost(lambda spec, browser: RecordingToy(log, spec), timeout_s=0.3, max_open_envs=4)
    other = host.get("other")
    hung = host.get("hung")
    with pytest.raises(EnvTimeout, match="reset did not return within 0.3 s"):
        host.call(lambda: hung.reset(-1), "reset")
    closed = {name for kind, name, _ in log if kind == "close"}
    assert closed == {"other", "hung"}
    fresh = host.get("other")
    assert fresh is not other and host.call(lambda: fresh.reset(1), "reset").goal
    new_thread = log[-1][2]
    assert new_thread != log[0][2]  # a new env thread replaced the hung one
    host.close()


def test_task_names_and_bad_config():
    assert task_name("miniwob/click-test") == "miniwob/click-test"
    assert task_name({"task_id": "shop/find", "goal": "x"}) == "shop/find"
    with pytest.raises(ValueError, match="max_open_envs"):
        EnvHost(lambda spec, browser: None, timeout_s=1, max_open_envs=0)
