"""config.distributed on one process: validation names the key, the trainer mesh and the policy server's device,
the weight sink that gathers sharded params for the server, and the lockstep agreements (trivial on one process)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.array import ArrayImpl
from jax.experimental import multihost_utils

from configs.constT10 import get_config
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.serving_weights import serving_copy
from jaxwebrl.parallel import distributed, multihost
from jaxwebrl.train import supervisor
from jaxwebrl.train.config_validation import ConfigError, validate


def toy(**distributed_fields):
    config = get_config("toy")
    for key, value in distributed_fields.items():
        if key.startswith("mesh_"):
            config.distributed.mesh[key[len("mesh_"):]] = value
        else:
            config.distributed[key] = value
    return config


@pytest.mark.parametrize("fields, expected", [
    ({"num_processes": 2, "process_id": 0}, "needs distributed.coordinator_address"),
    ({"num_processes": 2, "coordinator_address": "10.0.0.1:1234"}, "needs distributed.process_id"),
    ({"mesh_fsdp": 0}, r"distributed.mesh.fsdp=0: must be a positive size or -1"),
    ({"mesh_data": -1, "mesh_fsdp": -1}, "at most one axis may be -1"),
    ({"server_devices": 1}, r"distributed.server_devices=1: reserves devices from a trainer mesh"),
    ({"server_devices": -1}, "must be >= 0"),
])
def test_bad_distributed_settings_fail_validation_naming_the_key(fields, expected, monkeypatch):
    for var in distributed.ENV.values():
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match=expected):
        validate(toy(**fields))


def test_environment_fills_what_the_config_leaves_unset(monkeypatch):
    monkeypatch.setenv("JAXWEBRL_NUM_PROCESSES", "2")
    with pytest.raises(ConfigError, match="needs distributed.coordinator_address"):
        validate(toy())
    validate(toy(coordinator_address="127.0.0.1:1234", process_id=1))
    validate(toy(auto=True, server_devices=1))   # a detected cluster always trains on a mesh


def test_mesh_sizes_default_to_data_across_hosts_and_fsdp_inside():
    assert multihost.mesh_sizes({}, 1) is None   # one process, no axis set: the plain one-device trainer
    assert multihost.mesh_sizes({"mesh": {"data": None}}, 4) == {"data": 4, "fsdp": -1, "tensor": 1}
    assert multihost.mesh_sizes({"mesh": {"fsdp": -1}}, 1) == {"data": 1, "fsdp": -1, "tensor": 1}
    assert multihost.mesh_sizes({"mesh": {"data": 1, "fsdp": 16}}, 4) == {"data": 1, "fsdp": 16, "tensor": 1}
    assert multihost.mesh_sizes({"mesh": {"tensor": -1}}, 1) == {"data": 1, "fsdp": 1, "tensor": -1}
    assert multihost.initialize_settings(toy(num_processes=1).distributed.to_dict()) == {
        "coordinator_address": None, "num_processes": 1, "process_id": None, "local_device_ids": None,
        "local_device_count": None, "auto": None}


def test_layout_keeps_server_devices_out_of_the_trainer_mesh():
    plain = multihost.layout(toy())
    assert plain.mesh is None and plain.server_device == jax.local_devices()[0]
    split = multihost.layout(toy(server_devices=2, mesh_data=2, mesh_fsdp=-1))
    assert dict(split.mesh.shape) == {"data": 2, "fsdp": 3, "tensor": 1}
    assert split.server_device not in set(split.mesh.devices.flat)


class RecordingServer:
    def __init__(self):
        self.published, self.paused = [], 0

    def set_weights(self, params, version):
        self.published.append((params, version))

    def pause(self):
        self.paused += 1

    def resume(self):
        self.paused -= 1


def record_host_copies(monkeypatch) -> list[str]:
    """The names of the calls that copy an array to host memory from now on (until `monkeypatch.undo()`)."""
    host_copies = []

    def recording(name, function):
        def call(*args, **kwargs):
            host_copies.append(name)
            return function(*args, **kwargs)
        return call

    for module, name in ((multihost_utils, "process_allgather"), (jax, "device_get")):
        monkeypatch.setattr(module, name, recording(name, getattr(module, name)))
    # a device_put of a sharded array onto one device reads it back to the host (ArrayImpl._value) first
    monkeypatch.setattr(ArrayImpl, "_value", property(recording("_value", ArrayImpl._value.fget)))
    return host_copies


def test_sharded_params_reach_the_server_whole_on_its_device_without_a_host_copy(monkeypatch):
    """The trainer's bf16 serving copy is cast on the mesh, shard by shard, and on one process reaches the server's
    device device to device (`distributed.whole_on_device`): the sink used to gather the whole tree through host
    memory (`process_allgather`, a NumPy copy of every weight) even when every shard was this process's own."""
    layout = multihost.layout(toy(server_devices=2, mesh_data=3, mesh_fsdp=2))
    host = tiny_policy(seed=0).params
    params, key = multihost.place_train_state(host, jax.random.key(5), layout.mesh)
    assert {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(params)} == {6}
    assert any(not leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(params))   # FSDP-sharded
    assert key.sharding.is_fully_replicated
    served = serving_copy(params, jnp.bfloat16)   # the trainer's _publish
    for leaf, master in zip(jax.tree.leaves(served), jax.tree.leaves(params)):
        assert leaf.dtype == jnp.bfloat16 and leaf.sharding == master.sharding
    host_copies = record_host_copies(monkeypatch)
    server, inside = RecordingServer(), RecordingServer()
    sink = multihost.MeshWeightSink(server, layout.server_device)
    sink.set_weights(served, 3)
    mesh_device = layout.mesh.devices.flat[0]   # distributed.server_devices=0: the server shares a trainer device
    multihost.MeshWeightSink(inside, mesh_device).set_weights(served, 3)
    assert not host_copies, f"published through host memory: {len(host_copies)} calls of {set(host_copies)}"
    monkeypatch.undo()
    (published, version), = server.published
    assert version == 3
    for leaf, want in zip(jax.tree.leaves(published), jax.tree.leaves(host)):
        assert leaf.devices() == {layout.server_device} and leaf.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want).astype(jnp.bfloat16))
    assert all(leaf.devices() == {mesh_device} for leaf in jax.tree.leaves(inside.published[0][0]))
    sink.pause()
    assert server.paused == 1
    sink.resume()
    multihost.MeshWeightSink(None, layout.server_device).set_weights(params, 4)   # other processes: gather only
    metrics = multihost.NullMetrics("workdir", total_steps=2)
    metrics.write(1, {"loss": 0.0})
    metrics.close()


def test_the_server_and_the_greedy_check_on_a_mesh_start_from_the_whole_serving_copy(monkeypatch):
    """On a trainer mesh, process 0's policy server and the greedy check start from the trainer's publish as it will
    be: the serving dtype, cast on the mesh and gathered on the devices (no host copy), whole on the server's device.
    The server was handed the mesh's fp32 params and cast them in process 0 alone (a program on devices the other
    processes drive); the check warmed up on an fp32 copy, then every check passed bf16 weights. The check's own
    server compiles its sampler at start-up (a warm-up game) on the policy it is built with, and every check then
    passes whole weights on the server's device (`_MeshProbe`)."""
    config = toy(server_devices=2, mesh_data=3, mesh_fsdp=2)
    config.rollout.serve_dtype = "bfloat16"   # the toy's compute dtype is float32: make the cast visible
    layout = multihost.layout(config)
    policy = recipe_policy(config, mesh=layout.mesh)
    host_copies = record_host_copies(monkeypatch)
    served = supervisor._served_policy(config, policy, layout, primary=True)
    assert not host_copies, f"gathered through host memory: {len(host_copies)} calls of {set(host_copies)}"
    monkeypatch.undo()
    assert supervisor._served_policy(config, policy, layout, primary=False) is None   # the others only gather
    built = []
    probe = supervisor._greedy_probe(config, served, layout,
                                     lambda config, policy, num_seeds: built.append(policy) or RecordingServer())
    assert isinstance(probe, supervisor._MeshProbe) and probe.device == layout.server_device
    assert len(built) == 1 and built[0] is served
    for leaf, want in zip(jax.tree.leaves(served.params), jax.tree.leaves(policy.params)):
        assert leaf.devices() == {layout.server_device} and leaf.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want).astype(jnp.bfloat16))


def test_agreements_are_the_local_flag_on_one_process():
    assert distributed.all_processes(True) and not distributed.all_processes(False)
    assert distributed.any_process(True) and not distributed.any_process(False)


def test_other_processes_read_the_same_log_range_as_process_0(tmp_path):
    from jaxwebrl.buffer.ring import RingBuffer
    from tests.scale.train_steps import synthetic_episodes

    buffer = RingBuffer.create(str(tmp_path / "buffer"), capacity_steps=256, max_seq_len=64,
                               screenshot_shape=(8, 8, 3), max_images_per_step=1)
    episodes = synthetic_episodes(seed=0, groups=3, group_size=2)
    for episode in episodes[:5]:   # the third group is still filling
        buffer.append(episode)
    sent = []
    leader = multihost.LockstepBuffer(buffer, primary=True, broadcast=lambda header: sent.append(header) or header)
    ids = lambda result: [e.episode_id for e in result.episodes]
    first = leader.read(None, group_size=2)
    assert len(first.episodes) == 4 and first.cursor["pending"]
    buffer.append(episodes[5])     # committed after process 0's read: the others must not see it yet

    def follower(*broadcasts, **kw):   # process 0's broadcasts of one read (its range, then the held-back seqs)
        replay = iter(broadcasts)
        return multihost.LockstepBuffer(buffer, primary=False, broadcast=lambda _: next(replay), agree_any=bool, **kw)

    same = follower(*sent[:2]).read(None, group_size=2)
    assert ids(same) == ids(first) and same.cursor == first.cursor
    assert follower().screenshots is buffer.screenshots   # everything else is the buffer's own
    second = leader.read(first.cursor, group_size=2)
    assert len(sent) == 3           # nothing held back this time: the range alone
    assert ids(follower(sent[2]).read(first.cursor, group_size=2)) == ids(second) and len(second.episodes) == 2

    wrong = sent[0].copy()
    wrong[4] += 1                  # process 0 read one more episode than this process finds in the range
    with pytest.raises(RuntimeError, match="read log 0..5, 4 episodes, held back 1; process 0 read 0..5, 5 episodes"):
        follower(wrong, sent[1]).read(None, group_size=2)
    ahead = sent[2].copy()
    ahead[3] += 5                  # commits this process never sees: it retries, then fails instead of hanging
    with pytest.raises(RuntimeError, match="raise buffer.capacity_steps"):
        follower(ahead, timeout_s=0.2).read(first.cursor, group_size=2)


def test_every_process_holds_back_the_partial_groups_process_0_holds_back(tmp_path):
    """Whether a partial group's writer is alive was each process's own call (its pid check or its clock against
    the writer's lease, a 5-s memory of it): process 0 gave a stalled remote writer's group up while process 1 kept
    waiting, so once the group completed process 1 handed it to a step process 0 never saw (the ids differed: the
    run failed). Two readers of one buffer, process 0's broadcasts replayed to process 1."""
    import json
    import time

    from jaxwebrl.buffer.ring import RingBuffer
    from tests.scale.train_steps import synthetic_episodes

    path = tmp_path / "buffer"
    RingBuffer.create(str(path), capacity_steps=256, max_seq_len=64, screenshot_shape=(8, 8, 3),
                      max_images_per_step=1)
    writer, first, second = (RingBuffer.open(str(path)) for _ in range(3))   # a worker and two trainer processes
    lease = path / "writers" / writer._lease.writer_id
    episodes = synthetic_episodes(seed=0, groups=1, group_size=2)

    def lease_age(age_s: float) -> None:   # the worker's lease, as a process on another host sees it
        body = json.loads(lease.read_text())
        lease.write_text(json.dumps(dict(body, host="another-host", time=time.time() - age_s)))

    def lockstep_read(cursors):
        sent = []
        leader = multihost.LockstepBuffer(first, primary=True, broadcast=lambda x: sent.append(x) or x)
        ahead = leader.read(cursors[0], group_size=2)
        lease_age(0.0)                      # process 1's look at the lease: alive (its clock, or a later moment)
        replay = iter(sent)
        follower = multihost.LockstepBuffer(second, primary=False, broadcast=lambda _: next(replay), agree_any=bool)
        return ahead, follower.read(cursors[1], group_size=2)

    writer.append(episodes[0])
    lease_age(700.0)                        # stalled past REMOTE_LEASE_SECONDS, as process 0 sees it
    ahead, behind = lockstep_read([None, None])
    assert ahead.stats["incomplete"] == 1 and behind.cursor == ahead.cursor   # given up by every process
    writer.append(episodes[1])              # the worker was alive after all: its group completes
    ahead, behind = lockstep_read([ahead.cursor, behind.cursor])
    assert [e.episode_id for e in behind.episodes] == [e.episode_id for e in ahead.episodes]
    assert behind.cursor == ahead.cursor
