"""The trainer loop on real buffered toy episodes: dashboard metrics, Orbax checkpoints, exact resume."""

import io
import os
import struct
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.array import ArrayImpl
from PIL import Image
from tensorboardX.proto import event_pb2

from configs.constT10 import get_config
from jaxwebrl.checkpoint.layout import save_params
from jaxwebrl.checkpoint.policies import recipe_policy
from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.policy import Policy, init_params, tiny_policy
from jaxwebrl.parallel import mesh as mesh_lib
from jaxwebrl.train.metrics import DASHBOARD_KEYS, read_metrics

RUNNING_TOTALS = ("rollout/episodes_seen", "rollout/env_failed", "rollout/cut_", "rollout/dropped_", "buffer/",
                  "trainer/dropped_", "trainer/skipped_")
from jaxwebrl.train import trainer as trainer_module
from jaxwebrl.train.assembly import assemble
from jaxwebrl.train.trainer import Trainer
from tests.train.conftest import assert_on_partition_rules, play_toy


class RecordingSink:
    """Stands where the policy server stands: receives every published version, keeps the last weights."""

    def __init__(self):
        self.versions, self.params = [], None

    def set_weights(self, params, version):
        self.versions.append(version)
        self.params = params


def toy_config(max_steps):
    c = get_config("toy")
    c.train.max_steps = max_steps
    c.train.consumer_batch_size = 4         # 2 groups of 2: small rows, quick steps on a busy 2-core box
    c.env.group_size = 2
    c.train.ppo_n_epochs = 1
    c.train.dynamic_sampling = False        # every buffered group trains: the data suffices for 4 steps exactly
    c.rollout.max_head_offpolicyness = 100   # the episodes were all made before training starts
    c.buffer.max_seq_len = 512
    c.metrics.progress_bar = False
    c.checkpoint.async_save = True
    return c


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture
def filled_buffer(toy_buffer):
    play_toy(toy_buffer, groups=8, group_size=2, epsilon=0.6, seed=11)
    return toy_buffer


def train(config, workdir, policy, buffer, stop_at=None, timeout_s=900):
    sink = RecordingSink()
    trainer = Trainer(config, str(workdir), policy=policy, buffer=buffer, weight_sink=sink)
    deadline = time.monotonic() + timeout_s   # a starved run fails the test instead of hanging it
    trainer.run(stop=lambda: (stop_at is not None and trainer.state.step >= stop_at) or time.monotonic() > deadline)
    return trainer, sink


def test_steps_publish_versions_log_dashboard_and_checkpoint(policy, filled_buffer, tmp_path):
    trainer, sink = train(toy_config(2), tmp_path / "run", policy, filled_buffer)
    assert trainer.state.step == 2 and sink.versions == [0, 1, 2]
    records = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        missing = [k for k in DASHBOARD_KEYS if k not in record]
        assert not missing, missing
        assert np.isfinite(record["ppo_actor/update/actor_loss/avg"])
        assert record["ppo_actor/trajectories"] >= 4
    assert trainer.checkpointer.all_steps() == [1, 2]
    assert len(set(trainer.trained_episode_ids)) == len(trainer.trained_episode_ids)
    # the first step read the whole buffer: its seen-success is every episode's, before dynamic sampling
    episodes, _ = filled_buffer.read(None, group_size=2)
    won = np.mean([e.reward > 0 for e in episodes])
    assert records[0]["rollout/success_rate_seen"] == pytest.approx(won)


def test_two_steps_resume_two_steps_equals_four(policy, filled_buffer, tmp_path):
    config = toy_config(4)
    config.checkpoint.save_every_steps = 3   # the stop at step 2 falls between two saves: it saves step 2 itself
    straight, _ = train(config, tmp_path / "straight", policy, filled_buffer)
    first, _ = train(config, tmp_path / "resumed", policy, filled_buffer, stop_at=2)
    assert first.state.step == 2 and first.checkpointer.all_steps() == [2]
    # a fresh start holds its state committed to the device as the resume's restore does, so both run (and cache)
    # the same compiled programs: jit compiles one per committed-ness of its arguments
    for trainer in (straight, first):
        assert all(x.committed for x in jax.tree.leaves((trainer.state.params, trainer.state.opt_state)))
    second, sink = train(config, tmp_path / "resumed", policy, filled_buffer)
    assert sink.versions[0] == 2 and second.state.step == 4
    # every episode trained exactly once, and the same ones in the same order as the uninterrupted run
    assert first.trained_episode_ids + second.trained_episode_ids == straight.trained_episode_ids
    for a, b in zip(jax.tree.leaves(straight.state.params), jax.tree.leaves(second.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(straight.state.opt_state), jax.tree.leaves(second.state.opt_state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(jax.random.key_data(straight.state.rng), jax.random.key_data(second.state.rng))
    # the running totals go on from the checkpoint (they restarted at 0: 8 episodes seen, the 8 read again)
    totals = [k for k in read_metrics(str(tmp_path / "straight"))[-1] if k.startswith(RUNNING_TOTALS)]
    assert "rollout/episodes_seen" in totals and "buffer/incomplete" in totals and "trainer/skipped_batches" in totals
    ends = [{k: read_metrics(str(tmp_path / run))[-1][k] for k in totals} for run in ("straight", "resumed")]
    assert ends[0] == ends[1] and ends[0]["rollout/episodes_seen"] == 16


class HardStop(Exception):
    """The trainer process dies: nothing after this point is saved."""


@pytest.mark.slow   # two update compiles: ~50 s on a busy 2-core box (test_versions.py tests the rules in 2 s)
def test_a_hard_stop_after_a_publish_past_the_checkpoint_never_reuses_that_version(policy, filled_buffer, tmp_path):
    """Checkpoint at version 0, version 1 published, then the trainer dies. The resume used to publish version 1
    again with other weights, so an episode a still-running worker played on the lost version 1 looked fresh."""
    config = toy_config(2)
    config.checkpoint.save_every_steps = 100
    first = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=filled_buffer, weight_sink=RecordingSink())
    first.save()                                              # the checkpoint at step 0, version 0

    def die_after_step_1():
        if first.state.step >= 1:
            raise HardStop
        return False

    with pytest.raises(HardStop):
        first.run(stop=die_after_step_1)
    assert first.sink.versions == [0, 1] and first.checkpointer.all_steps() == [0]
    lost = filled_buffer.read(filled_buffer.latest_cursor())
    play_toy(filled_buffer, groups=2, group_size=2, epsilon=0.6, seed=12, version=1)   # a remote worker, on v1
    lost_ids = {e.episode_id for e in filled_buffer.read(lost.cursor).episodes}
    second, sink = train(config, tmp_path / "run", policy, filled_buffer, stop_at=1)
    assert sink.versions == [0, 2]                            # v1 is never published again
    handed_out = set(second.trained_episode_ids)
    while batch := second.gatherer.pop_batch(second.state.version):   # the rest of the buffer, in order
        handed_out |= {e.episode_id for e in batch}
    assert second.gatherer.counts.dropped_stale == len(lost_ids) == 4   # v1's: stale, though 1 version behind 2
    assert not lost_ids & handed_out and len(handed_out) == 16


def _device_bytes(tree, device) -> int:
    """Bytes `device` holds of the arrays of `tree`."""
    return sum(shard.data.nbytes for leaf in jax.tree.leaves(tree) for shard in leaf.addressable_shards
               if shard.device == device)


class _Assembled(Exception):
    """Raised with the trainer's assembled batch (the test needs no update)."""


def test_a_mesh_trainer_shards_adam_moments_like_weights_and_pads_rows_to_whole_batch_shards(
        filled_buffer, tmp_path, monkeypatch):
    """(data 2, fsdp 2, tensor 2) over the 8 CPU devices. A bare `jax.jit(optimizer.init)` made every moment whole on
    device 0 (twice the model's weights on one chip: out of memory at 8B) and a checkpoint restore read into that
    layout. The start-up copy of the weights (and the bf16 reference's cast) was made whole on device 0, then read
    back to the host and sharded from there: now each device receives its shard device to device, no array larger
    than the PRNG key is read back to the host. A minibatch of a row count the 4 batch shards do not divide ran on
    several chips at once (test_update.py measures it): the trainer now pads rows to whole shards. (The update
    keeps the state's layout: test_update.py's sharded update test.) The policy is the supervisor's: the recipe
    made on the mesh (test_partition.py); the run warm-starts (`model.init_params`), read onto the same shardings."""
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    config = toy_config(1)
    config.actor.kl_loss_coef, config.actor.ref_dtype = 0.1, "bfloat16"
    policy = recipe_policy(config, mesh=mesh)
    warm = init_params(policy.config, seed=1)[1]   # on one device, as launch/sft.py saves them
    save_params(warm, str(tmp_path / "warm"), {"step": 3})
    config.model.init_params = str(tmp_path / "warm")
    os.makedirs(tmp_path / "run")   # the reference's record is written there
    host_reads, value = [], ArrayImpl._value
    monkeypatch.setattr(ArrayImpl, "_value", property(lambda x: host_reads.append(x.size) or value.fget(x)))
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=filled_buffer,
                      weight_sink=RecordingSink(), mesh=mesh)
    monkeypatch.undo()
    assert max(host_reads, default=0) <= 2, f"arrays read back to the host at start-up, sizes {sorted(host_reads)}"
    params, opt_state = trainer.state.params, trainer.state.opt_state
    assert_on_partition_rules(params, opt_state, mesh)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(warm)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    held = trainer.reference.params
    for leaf, want in zip(jax.tree.leaves(held), jax.tree.leaves(params)):
        assert leaf.dtype == jnp.bfloat16 and leaf.sharding.is_equivalent_to(want.sharding, leaf.ndim)
    for device in mesh.devices.flat:   # two moments per weight shard, and a few scalars
        assert _device_bytes(opt_state, device) <= 2 * _device_bytes(params, device) + 64

    episodes, _ = filled_buffer.read(None, group_size=2)
    episodes = next(episodes[:n] for n in range(1, len(episodes)) if sum(e.num_steps for e in episodes[:n]) % 4)

    def assemble_then_stop(*args, **kwargs):   # the real assembly, then no update
        raise _Assembled(assemble(*args, **kwargs))

    monkeypatch.setattr(trainer_module, "assemble", assemble_then_stop)
    with pytest.raises(_Assembled) as assembled:
        trainer.train_step(episodes)
    rows = assembled.value.args[0].input_ids.shape[0]
    assert rows % (trainer.settings.n_minibatches * mesh_lib.batch_divisor(mesh)) == 0, rows


def test_a_stop_inside_an_update_discards_its_step_and_saves_nothing_of_the_donated_state(policy, filled_buffer,
                                                                                             tmp_path, caplog):
    config = toy_config(4)
    config.checkpoint.save_every_steps = 3
    config.train.ppo_n_epochs = 2                # two updates a step: the stop comes after the first donated the state
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=filled_buffer, weight_sink=RecordingSink())
    compiled, updates = trainer.updater._step, []
    trainer.updater._step = lambda *args: updates.append(1) or compiled(*args)
    with caplog.at_level("INFO"):
        trainer.run(stop=lambda: len(updates) >= 3)   # step 1 whole, step 2 stopped after its first update
    assert trainer.state.step == 1 and trainer.checkpointer.all_steps() == []
    assert any("stopped during train step 2: it is discarded (resume from step 0)" in r.getMessage()
               for r in caplog.records)


def test_a_batch_held_for_the_other_processes_at_a_stop_is_read_again_after_the_resume(policy, filled_buffer, tmp_path):
    config = toy_config(4)
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=filled_buffer, weight_sink=RecordingSink())
    trainer.poll()
    trainer._held = trainer.gatherer.pop_batch(trainer.state.version)   # popped, the other processes not yet ready
    held = {e.episode_id for e in trainer._held}
    trainer.save()
    trainer.close()
    again = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=filled_buffer, weight_sink=RecordingSink())
    again.poll()
    assert held and held <= {e.episode_id for e in again.gatherer.pending_episodes()}
    again.close()


def test_sync_mode_trains_strictly_on_policy(policy, filled_buffer, tmp_path):
    """Synchronous mode ignores η: after a step, every episode made by the previous version is dropped as stale
    (the async run with the same config trains them)."""
    for mode, leftover_trains in (("sync", False), ("async", True)):
        config = toy_config(2)
        config.rollout.mode = mode
        trainer, _ = train(config, tmp_path / mode, policy, filled_buffer, stop_at=1)
        assert trainer.state.step == 1 and trainer.gatherer.ready_trajectories() > 0
        batch = trainer.gatherer.pop_batch(trainer.state.version)
        assert (batch is not None) == leftover_trains
        assert (trainer.gatherer.counts.dropped_stale > 0) == (not leftover_trains)


def test_stop_at_success_needs_two_steps_in_a_row(policy, filled_buffer, tmp_path):
    config = toy_config(4)
    config.train.stop_at_success = 0.9
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=filled_buffer, weight_sink=RecordingSink())
    try:
        seen = (0.95, 0.5, 0.92, float("nan"), 0.93, 0.97)
        assert [bool(trainer._success_target_reached({"rollout/success_rate_seen": v})) for v in seen] == [
            False, False, False, False, False, True]
    finally:
        trainer.close()


def test_stop_at_greedy_success_stops_at_the_first_step_the_check_reaches_it(policy, filled_buffer, tmp_path):
    config = toy_config(4)
    config.train.stop_at_greedy_success = 0.75
    checked = []

    def probe(params, version):   # stands where eval/probe.py's SuccessProbe stands (tested in tests/eval)
        assert jax.tree.structure(params) == jax.tree.structure(policy.params)
        checked.append(version)
        return (0.25, 0.75, 1.0)[len(checked) - 1]

    workdir = str(tmp_path / "run")
    trainer = Trainer(config, workdir, policy=policy, buffer=filled_buffer, weight_sink=RecordingSink(),
                      greedy_probe=probe)
    assert trainer.run() == 2 and checked == [1, 2]              # one check after each step, on its version
    assert [r["eval/greedy_success"] for r in read_metrics(workdir)] == [0.25, 0.75]
    assert trainer.checkpointer.latest_step() == 2                # the step that reached it is saved


def test_stop_at_greedy_success_without_a_check_is_one_line(tmp_path):
    """Training does not import evaluation (docs/architecture.md): the launcher hands the check in, and a caller
    that asks for the stop without one is told how, before any work starts."""
    from jaxwebrl.errors import RunError
    from jaxwebrl.train import supervisor

    config = toy_config(1)
    config.train.stop_at_greedy_success = 1.0
    with pytest.raises(RunError, match=r"greedy_probe=jaxwebrl\.eval\.probe\.SuccessProbe"):
        supervisor.run(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def _tensorboard_events(logdir):
    """Every Event of the TFRecord event files under `logdir` (length, crc, payload, crc per record)."""
    events = []
    for name in sorted(os.listdir(logdir)):
        data = open(os.path.join(logdir, name), "rb").read()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[at + 12:at + 12 + length])
            events.append(event)
            at += 12 + length + 4
    return events


def test_sampled_episodes_reach_tensorboard_as_images_and_text(policy, filled_buffer, tmp_path):
    config = toy_config(2)
    config.metrics.sample_episodes_every = 2
    config.metrics.sample_episodes = 3
    train(config, tmp_path / "run", policy, filled_buffer)
    values = [(e.step, v) for e in _tensorboard_events(str(tmp_path / "run" / "tensorboard"))
              for v in e.summary.value if v.tag.startswith("episodes/")]
    assert {step for step, _ in values} == {2}            # every 2 steps: step 2 only
    images = {v.tag: v.image for _, v in values if v.HasField("image")}
    texts = {v.tag: v.tensor.string_val[0].decode() for _, v in values if v.HasField("tensor")}
    assert sorted(images) == ["episodes/0", "episodes/1", "episodes/2"]
    assert sorted(texts) == ["episodes/0/text_summary", "episodes/1/text_summary", "episodes/2/text_summary"]
    for image in images.values():                         # the toy's three 64x64 steps side by side
        assert (image.height, image.width) == (64, 3 * 64 + 2 * 4)
        assert Image.open(io.BytesIO(image.encoded_image_string)).size == (image.width, image.height)
    outcomes = [t.split(" · ")[1] for t in texts.values()]
    assert "success" in outcomes and "failure" in outcomes     # the sample mixes outcomes
    assert all("**step 3**" in t and "Action: click(" in t for t in texts.values())


class KeepingSink(RecordingSink):
    def set_weights(self, params, version):
        super().set_weights(params, version)
        self.params = params


@pytest.mark.parametrize("serve_dtype", [None, "float32"], ids=["compute_dtype", "fp32"])
def test_publishes_a_fresh_copy_in_the_serving_dtype_and_keeps_the_fp32_master(toy_buffer, tmp_path, serve_dtype):
    config_model = tiny_config(dtype="bfloat16").replace(param_dtype="float32")
    module, params = init_params(config_model, seed=0)
    policy = Policy(config_model, module, params, tiny_policy().processor)
    config = toy_config(1)
    config.rollout.serve_dtype = serve_dtype
    sink = KeepingSink()
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=toy_buffer, weight_sink=sink)
    try:
        dtype = jnp.dtype(serve_dtype or "bfloat16")
        assert sink.versions == [0]
        for master, served in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(sink.params)):
            assert master.dtype == jnp.float32 and served.dtype == dtype
            assert served.unsafe_buffer_pointer() != master.unsafe_buffer_pointer()   # the update donates master
            np.testing.assert_array_equal(np.asarray(served), np.asarray(master.astype(dtype)))
    finally:
        trainer.close()
