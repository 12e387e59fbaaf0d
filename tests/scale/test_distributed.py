"""distributed.py on one process: settings from config and environment, no-op initialize, meshes for the trainer
and the policy server on disjoint devices, host rows <-> global arrays, process-major layout across hosts."""

import types

import jax
import numpy as np
import pytest

from jaxwebrl.parallel import distributed


def test_settings_come_from_config_then_environment():
    env = {"JAXWEBRL_COORDINATOR": "10.0.0.1:1234", "JAXWEBRL_NUM_PROCESSES": "4", "JAXWEBRL_PROCESS_ID": "3",
           "JAXWEBRL_LOCAL_DEVICE_IDS": "0,1"}
    s = distributed.resolve_settings(None, env)
    assert (s.coordinator_address, s.num_processes, s.process_id, s.local_device_ids) == ("10.0.0.1:1234", 4, 3, (0, 1))
    assert s.multi_process
    s = distributed.resolve_settings({"process_id": 1, "coordinator_address": None}, env)
    assert s.process_id == 1 and s.coordinator_address == "10.0.0.1:1234"
    assert not distributed.resolve_settings({}, {}).multi_process
    assert distributed.resolve_settings({"auto": True}, {}).multi_process


@pytest.mark.parametrize("config, expected", [
    ({"num_processes": 2, "process_id": 0}, "needs distributed.coordinator_address"),
    ({"num_processes": 2, "coordinator_address": "h:1"}, "needs distributed.process_id"),
    ({"num_processes": 2, "coordinator_address": "h:1", "process_id": 2}, "outside 0..1"),
    ({"num_processes": "two"}, "must be an integer"),
    ({"coordinator": "h:1"}, "unknown distributed setting"),
])
def test_bad_settings_name_the_key(config, expected):
    with pytest.raises(ValueError, match=expected):
        distributed.resolve_settings(config, {})


def test_single_process_initialize_is_a_noop():
    settings = distributed.initialize({"num_processes": 1})
    assert not settings.multi_process and not jax.distributed.is_initialized()
    distributed.shutdown()
    distributed.sync("noop")
    assert distributed.is_primary()


def test_policy_server_and_trainer_get_disjoint_meshes():
    train, server = distributed.server_and_trainer_meshes(2, {"data": 1, "fsdp": -1})
    assert dict(train.shape) == {"data": 1, "fsdp": 6, "tensor": 1} and dict(server.shape)["data"] == 2
    assert not set(train.devices.flat) & set(server.devices.flat)
    with pytest.raises(ValueError, match="between 1 and 7"):
        distributed.split_server_devices(8)


def test_host_rows_become_sharded_global_arrays_and_back():
    mesh = distributed.process_mesh({"data": 2, "fsdp": -1})
    rows = {"input_ids": np.arange(32, dtype=np.int32).reshape(8, 4), "reward": np.float32(1.5)}
    batch = distributed.host_local_to_global(rows, mesh)
    assert batch["input_ids"].sharding.spec[0] == ("data", "fsdp") and len(batch["input_ids"].addressable_shards) == 8
    back = distributed.global_to_host(batch)
    np.testing.assert_array_equal(back["input_ids"], rows["input_ids"])
    key = distributed.replicated_key(jax.random.key(7), mesh)
    assert key.sharding.is_fully_replicated
    np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(jax.random.key(7)))


def test_hosts_split_data_first_and_tensor_stays_on_a_host():
    fake = [types.SimpleNamespace(process_index=p, id=10 * p + i) for p in (1, 0) for i in range(4)]
    grid = distributed._process_major_grid(fake, ici=(1, 2, 2), dcn=(2, 1, 1))
    assert grid.shape == (2, 2, 2)
    assert {d.process_index for d in grid[0].flat} == {0} and {d.process_index for d in grid[1].flat} == {1}
    assert distributed._outer_split((4, 2, 1), 8) == (4, 2, 1)
    with pytest.raises(ValueError, match="tensor` inside one host"):
        distributed._outer_split((1, 1, 8), 2)
