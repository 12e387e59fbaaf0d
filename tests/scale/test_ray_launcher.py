"""Ray-launched rollout workers on a local Ray cluster: real toy episodes over the pyzmq transport into a real
ring buffer, a refused token stops the fleet for good, a killed actor is replaced, close leaves no actor."""

import json
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason='the Ray launcher tests need Ray: pip install "ray==2.60.0"')

from jaxwebrl.buffer.ring import RingBuffer  # noqa: E402
from jaxwebrl.rollout.ray_launcher import RayWorkerPool, pool_for  # noqa: E402
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder  # noqa: E402
from jaxwebrl.rollout.transport import TransportServer, new_token  # noqa: E402
from tests.rollout.test_pool import wait_for  # noqa: E402

GROUP = 2


@pytest.fixture(scope="module")
def local_ray():
    for attempt in range(3):  # Ray gives its raylet a fixed 30 s to register: a busy 2-core box can miss it
        try:
            ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 << 20, log_to_driver=False,
                     configure_logging=False)
            break
        except Exception as exc:  # noqa: BLE001 - "The current node timed out during startup"
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    yield
    ray.shutdown()


def toy_spec(tmp_path, address, token):
    path = str(tmp_path / "buffer")
    RingBuffer.create(path, capacity_steps=512, max_seq_len=1024, screenshot_shape=(64, 64, 3), max_images_per_step=1)
    return {"worker": {"tasks": ["toy"], "group_size": GROUP, "max_new_tokens": 64, "prompt": {"window": 0}},
            "policy": {"kind": "remote", "address": address, "token": token, "timeout_s": 60.0},
            "buffer": {"path": path}}


def count_episodes(path):
    episodes, _ = RingBuffer.open(path).read()
    return len(episodes)


def test_ray_workers_play_real_episodes_over_the_transport(tmp_path, local_ray):
    token = new_token()
    buffer_path = str(tmp_path / "buffer")
    backend = ScriptedBackend(toy_oracle_responder(epsilon=0.5), version=5,
                              fetch_image=lambda ref: RingBuffer.open(buffer_path).screenshots.get(ref))
    with TransportServer(backend, token=token) as server:
        spec = toy_spec(tmp_path, server.address, token)
        with RayWorkerPool(spec, num_workers=2, num_cpus_per_worker=1, grace_s=20) as pool:
            wait_for(lambda: count_episodes(buffer_path) >= 2 * GROUP, 150, "two groups from the Ray workers")
            pool.raise_if_failed()
            live = pool.stats()
            assert len(live) == 2 and sum(s["episodes"] for s in live) >= 2 * GROUP
            assert pool.alive() == 2
        assert pool.alive() == 0
    assert backend.requests > 0
    episodes, _ = RingBuffer.open(buffer_path).read()
    assert len(episodes) >= 2 * GROUP
    for episode in episodes:
        assert episode.num_steps == 3  # the toy task has three turns
        for ids, mask, versions in ((s.input_ids, s.loss_mask, s.versions) for s in episode.steps):
            assert mask.sum() > 0 and np.all(versions[mask == 1] == 5) and np.all(versions[mask == 0] == -1)
            assert len(ids) == len(mask)
    groups = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, []).append(episode)
    assert all(len(members) <= GROUP for members in groups.values())
    assert {e.info["worker_id"] for e in episodes} <= {0, 1}
    wait_for(lambda: ray.available_resources().get("CPU", 0) == 2, 30, "the actors' CPUs to be released")


def test_wrong_token_is_refused_and_never_restarted(tmp_path, local_ray):
    with TransportServer(ScriptedBackend(toy_oracle_responder()), token=new_token()) as server:
        spec = toy_spec(tmp_path, server.address, new_token())  # not the server's token
        with RayWorkerPool(spec, num_workers=1, grace_s=10) as pool:
            wait_for(lambda: pool.fatal, 120, "the refused worker to report")
            with pytest.raises(RuntimeError, match="refused"):
                pool.raise_if_failed()
            time.sleep(1.0)
            assert pool.restarts == 0 and pool.alive() == 0
    assert count_episodes(spec["buffer"]["path"]) == 0


def test_killed_actor_is_replaced(tmp_path, local_ray):
    token = new_token()
    with TransportServer(ScriptedBackend(toy_oracle_responder()), token=token) as server:
        spec = toy_spec(tmp_path, server.address, token)
        with RayWorkerPool(spec, num_workers=1, grace_s=10, min_uptime_s=0.0) as pool:
            wait_for(lambda: count_episodes(spec["buffer"]["path"]) >= GROUP, 120, "a first group")
            ray.kill(pool._actors[0], no_restart=True)
            wait_for(lambda: pool.restarts == 1 and pool.alive() == 1, 60, "the replacement actor")
            before = count_episodes(spec["buffer"]["path"])
            wait_for(lambda: count_episodes(spec["buffer"]["path"]) >= before + GROUP, 120,
                     "the replacement to append a group")
            assert not pool.fatal


def test_config_picks_the_launcher():
    from configs.constT10 import get_config

    config = get_config("toy")
    spec = {"worker": {"tasks": ["toy"]}, "policy": {"kind": "scripted", "responder": "toy_oracle"},
            "buffer": {"path": "/nonexistent"}}
    assert type(pool_for(config, spec)).__name__ == "WorkerPool"
    config.rollout.launcher = "ray"
    pool = pool_for(config, spec)
    assert isinstance(pool, RayWorkerPool) and pool.num_workers == config.rollout.num_workers
    config.rollout.launcher = "slurm"
    with pytest.raises(ValueError, match="rollout.launcher='slurm'"):
        pool_for(config, spec)


def test_a_fatal_actor_is_recorded_before_the_pool_counts_it_gone(tmp_path):
    """The issue-32 audit, without a cluster: `_finished` on a run that raised FatalWorkerError, with a fake Ray.
    The moment `alive()` drops (the run slot cleared), `fatal` must already say why."""
    from types import SimpleNamespace

    from jaxwebrl.rollout.ray_launcher import FatalWorkerError

    class TaskError(Exception):
        def as_instanceof_cause(self):
            return FatalWorkerError("refused token")

    def get(run):
        raise TaskError()

    fake_ray = SimpleNamespace(get=get, kill=lambda actor, no_restart: None,
                               exceptions=SimpleNamespace(RayTaskError=TaskError, RayActorError=RuntimeError))
    spec = toy_spec(tmp_path, "tcp://127.0.0.1:9", new_token())
    pool = RayWorkerPool(spec, num_workers=1)
    seen = []

    class Slots(list):
        def __setitem__(self, index, value):   # the moment alive() changes
            if value is None:
                seen.append(dict(pool.fatal))
            super().__setitem__(index, value)

    pool._ray, pool._actors, pool._runs = fake_ray, ["actor"], Slots(["run"])
    pool._finished(0, "run")
    assert seen == [{0: "refused token"}] and pool.alive() == 0
    with pytest.raises(RuntimeError, match="worker 0: refused token"):
        pool.raise_if_failed()


def test_an_actor_failing_the_same_way_is_not_replaced_for_ever(tmp_path):
    """WorkerPool stops a worker that failed max_same_failures times in a row the same way (numbers aside: a browser
    that dies at every start differs only in chromedriver's port); RayWorkerPool, whose supervision "mirrors" it,
    replaced such an actor for ever. `_finished` on runs that raised, with a fake Ray (no cluster)."""
    from types import SimpleNamespace

    class TaskError(Exception):
        def as_instanceof_cause(self):
            return self.args[0]

    lives = iter(range(40000, 40010))

    def get(run):
        raise TaskError(RuntimeError(f"EnvGivenUp: toy failed 4 times in a row before its first step (last: "
                                     f"BrowserCrashed: chromedriver unreachable (port={next(lives)}))"))

    fake_ray = SimpleNamespace(get=get, kill=lambda actor, no_restart: None,
                               exceptions=SimpleNamespace(RayTaskError=TaskError, RayActorError=OSError))
    pool = RayWorkerPool(toy_spec(tmp_path, "tcp://127.0.0.1:9", new_token()), num_workers=1, max_same_failures=3)
    pool._ray = fake_ray
    for life in range(3):
        assert not pool.fatal, f"stopped after {life} lives"
        pool._actors, pool._runs = ["actor"], ["run"]
        pool._finished(0, "run")
    assert pool.fatal and pool.alive() == 0
    with pytest.raises(RuntimeError, match=r"worker 0: failed 3 times in a row with: .*port=40002"):
        pool.raise_if_failed()

@pytest.mark.parametrize("fault", ["first step too long", "refused request"])
def test_a_worker_that_restarting_cannot_help_stops_its_actor_for_good(tmp_path, fault):
    """A local pool's worker exits EXIT_FATAL on what a restart cannot cure (worker_process.restart_cannot_help: a
    first step longer than the buffer's rows, a request the policy server refuses as malformed, a buffer that keeps
    refusing episodes, a task whose own page or spec fails before its first step); a Ray actor raised those raw, so
    RayWorkerPool replaced it for ever (it has no same-failure rule). Without a cluster: the actor's body runs here."""
    from jaxwebrl.rollout.ray_launcher import FatalWorkerError, RolloutActor
    from jaxwebrl.rollout.wire import RequestRefused

    def refuse(request):
        raise RequestRefused("generate request 'messages' must be a list of chat message dicts")

    token = new_token()
    with TransportServer(refuse, token=token) as server:
        spec = toy_spec(tmp_path, server.address, token)
        if fault == "first step too long":
            spec["buffer"]["path"] = str(tmp_path / "short")
            RingBuffer.create(spec["buffer"]["path"], capacity_steps=64, max_seq_len=16, screenshot_shape=(64, 64, 3),
                              max_images_per_step=1)
            spec["policy"] = {"kind": "scripted", "responder": "toy_oracle"}
        expected = "CannotTrain: the first prompt" if fault == "first step too long" else "TransportRequestRefused"
        with pytest.raises(FatalWorkerError, match=f"worker 0 stops for good: {expected}"):
            RolloutActor(json.dumps(spec), 0, 0).run()
