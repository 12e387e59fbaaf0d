"""One bad episode or batch must not stop, poison or silently shrink a run (real buffer files, real updates):
non-finite updates are rolled back before publishing and their batch skipped for good, out-of-vocabulary
episodes never reach jit, 64-bit ids do not wrap, and what the buffer lost is a metric and a log line.

Every batch here is the same two played groups (copies under new group ids), so the update compiles once."""

import dataclasses
import json
import logging
import multiprocessing
import os
import signal

import jax
import numpy as np
import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.checkpoint.checkpointer import Checkpointer
from jaxwebrl.errors import CannotTrain, CheckpointError, TrainingDiverged
from jaxwebrl.train.metrics import read_metrics
from jaxwebrl.train.trainer import Trainer
from tests.disks import tmpfs
from tests.train import writers
from tests.train.conftest import play_toy
from tests.train.test_trainer import policy, toy_config  # noqa: F401 - policy is a module-scoped fixture


class FiniteSink:
    """The policy server's seat: records each published version and whether its weights were all finite."""

    def __init__(self):
        self.published = []

    def set_weights(self, params, version):
        finite = all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(params))
        self.published.append((version, finite))


@pytest.fixture
def two_groups(toy_buffer):
    """(buffer, [group A, group B]): two played groups of 2 toy episodes, the first batch of every test."""
    play_toy(toy_buffer, groups=2, group_size=2, epsilon=0.6, seed=11)
    groups = {}
    for e in toy_buffer.read(None, group_size=2).episodes:
        groups.setdefault(e.group_id, []).append(e)
    return toy_buffer, list(groups.values())


def append_group(buffer, members, group_id, edit=lambda e: e) -> list[int]:
    """Appends copies of `members` as group `group_id` (each made by `edit(episode) -> Episode`); returns their
    episode ids."""
    return [buffer.append(edit(dataclasses.replace(e, episode_id=None, group_id=group_id))) for e in members]


def absurd_logprobs(e):
    """`e` with behaviour log-probs finite and <= 0, so the buffer takes it, but the importance weights overflow."""
    return dataclasses.replace(e, steps=tuple(
        dataclasses.replace(s, behave_logprobs=np.where(s.loss_mask > 0, -3e38, 0).astype(np.float32))
        for s in e.steps))


def run(max_steps, workdir, policy, buffer):
    sink = FiniteSink()
    trainer = Trainer(toy_config(max_steps), str(workdir), policy=policy, buffer=buffer, weight_sink=sink)
    trainer.run()
    return trainer, sink


def trained_ids(workdir):
    with open(os.path.join(workdir, "trained_episodes.jsonl")) as f:
        return [i for line in f for i in json.loads(line)["episode_ids"]]


def test_non_finite_update_is_rolled_back_skipped_and_not_met_again_on_resume(policy, two_groups, tmp_path, caplog):
    buffer, (a, b) = two_groups
    bad_ids = append_group(buffer, a, 1, absurd_logprobs) + append_group(buffer, b, 2)   # batch 2: skipped
    append_group(buffer, a, 3), append_group(buffer, b, 4)
    with caplog.at_level(logging.WARNING, logger="jaxwebrl.train"):
        first, sink = run(2, tmp_path / "run", policy, buffer)
    assert first.state.step == 2 and first.skipped_batches == 1
    assert sink.published == [(0, True), (1, True), (2, True)]     # the NaN weights never reached the server
    assert [r["trainer/skipped_batches"] for r in read_metrics(str(tmp_path / "run"))] == [0, 1]
    assert any("train step 2 skipped" in r.getMessage() and "rolled back" in r.getMessage() for r in caplog.records)
    with open(tmp_path / "run" / "skipped_batches.jsonl") as f:
        skipped = [json.loads(line) for line in f]
    assert len(skipped) == 1 and sorted(skipped[0]["episode_ids"]) == sorted(bad_ids)
    assert "rolled back" in skipped[0]["reason"]

    fresh = append_group(buffer, a, 5) + append_group(buffer, b, 6)
    resumed = Trainer(toy_config(3), str(tmp_path / "run"), policy=policy, buffer=buffer, weight_sink=FiniteSink())
    assert resumed.state.step == 2                                       # from the checkpoint of step 2
    resumed.poll()                                                       # what the resumed run would train next
    pending = resumed.gatherer.pending_episodes()
    assert sorted(e.episode_id for e in pending) == sorted(fresh)   # the skipped batch is behind it
    resumed.close()
    assert not set(trained_ids(tmp_path / "run")) & set(bad_ids)


def test_without_the_rollback_copy_a_non_finite_step_stops_the_run_and_publishes_nothing(policy, two_groups,
                                                                                          tmp_path):
    """train.rollback_non_finite=False (the real-width rehearsal: no room for a second train state): the same bad
    batch ends the run with TrainingDiverged in one message naming the knob; the NaN weights reach neither the
    policy server nor a checkpoint, and the resumed run starts from the last good step."""
    buffer, (a, b) = two_groups
    append_group(buffer, a, 1, absurd_logprobs), append_group(buffer, b, 2)   # batch 2 diverges
    config = toy_config(2)
    config.train.rollback_non_finite = False
    sink = FiniteSink()
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=buffer, weight_sink=sink)
    with pytest.raises(TrainingDiverged, match="train step 2: .*rollback_non_finite=True"):
        trainer.run()
    trainer.close()
    assert sink.published == [(0, True), (1, True)]
    resumed = Trainer(toy_config(2), str(tmp_path / "run"), policy=policy, buffer=buffer, weight_sink=FiniteSink())
    assert resumed.state.step == 1
    resumed.close()


def test_out_of_vocabulary_episode_never_reaches_jit_and_64_bit_group_ids_do_not_wrap(policy, two_groups, tmp_path):
    buffer, (a, b) = two_groups
    vocab = policy.config.text.vocab_size

    def step(name, group_ids, extra=()):
        batch = [dataclasses.replace(e, group_id=g) for e, g in zip(a + b, group_ids)] + list(extra)
        sink = FiniteSink()
        trainer = Trainer(toy_config(1), str(tmp_path / name), policy=policy, buffer=buffer, weight_sink=sink)
        scalars, _ = trainer.train_step(batch)
        trainer.close()
        return trainer, sink, scalars

    _, _, plain = step("plain", [5, 5, 7, 7])
    _, _, wide = step("wide", [5, 5, 5 + 2**32, 5 + 2**32])   # in int32 both groups are 5: one group of 4
    for key in ("ppo_actor/update/actor_loss/avg", "ppo_actor/advantages/avg", "ppo_actor/update/grad_norm"):
        assert wide[key] == pytest.approx(plain[key]), key

    ids = a[0].steps[0].input_ids.copy()
    ids[-1] = vocab + 2**20                                    # a buffer without vocab_size took it
    oov = dataclasses.replace(a[0], group_id=9, steps=(dataclasses.replace(a[0].steps[0], input_ids=ids),)
                              + a[0].steps[1:])
    trainer, sink, scalars = step("oov", [5, 5, 7, 7], [oov])
    assert trainer.dropped_invalid_episodes == 1 and scalars["ppo_actor/trajectories"] == 4
    assert sink.published == [(0, True), (1, True)]
    assert scalars["ppo_actor/update/actor_loss/avg"] == pytest.approx(plain["ppo_actor/update/actor_loss/avg"])
    assert scalars["trainer/dropped_invalid_episodes"] == 1


def test_buffer_losses_are_metrics_and_a_killed_writers_partial_group_is_counted_after_resume(policy, two_groups,
                                                                                                tmp_path, caplog):
    buffer, (a, b) = two_groups
    victim = append_group(buffer, a, 3)[1]   # its rows get random bytes: group 3 can never be trained whole
    later = append_group(buffer, a, 4) + append_group(buffer, b, 5)
    chunk = os.path.join(buffer.spec["path"], "rows", f"c.{victim % buffer.config.capacity_steps}.0")
    with open(chunk, "r+b") as f:
        f.write(os.urandom(os.path.getsize(chunk)))
    spawn = multiprocessing.get_context("spawn")
    done = spawn.Event()
    writer = spawn.Process(target=writers.append_half_a_group, args=(buffer.spec["path"], 4242, done))
    writer.start()
    try:
        assert done.wait(60)
        with caplog.at_level(logging.WARNING):
            first, _ = run(1, tmp_path / "run", policy, buffer)
        assert first.state.step == 1
        record = read_metrics(str(tmp_path / "run"))[-1]
        assert record["buffer/corrupt"] == 1 and record["buffer/incomplete"] == 1   # the victim and its sibling
        assert first.ledger.cursor["pending"], "the live writer's half group waits for its second episode"
        assert any("ring buffer read" in r.getMessage() and "damaged on disk" in r.getMessage()
                   for r in caplog.records)
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(30)
    caplog.clear()
    reopened = RingBuffer.open(buffer.spec["path"])   # the resumed run is a new process
    with caplog.at_level(logging.WARNING):
        resumed, _ = run(2, tmp_path / "run", policy, reopened)   # the run, killed and resumed
    assert resumed.state.step == 2
    record = read_metrics(str(tmp_path / "run"))[-1]
    # it re-reads from the checkpointed cursor (groups read but not trained yet), so it meets the damaged
    # episode and its sibling again; the dead writer's half group is given up now instead of waiting forever
    assert record["buffer/corrupt"] == 1 and record["buffer/incomplete"] == 2
    assert resumed.ledger.cursor["pending"] == []
    assert any("can never complete" in r.getMessage() for r in caplog.records)
    assert sorted(trained_ids(tmp_path / "run")) == sorted([e.episode_id for e in a + b] + later)


def _kib(path) -> int:
    """KiB of the files under `path` as a tmpfs counts them (whole 4 KiB pages)."""
    return sum(-(-os.path.getsize(os.path.join(d, f)) // 4096) * 4 for d, _, files in os.walk(path) for f in files)


def test_a_full_disk_at_checkpoint_time_stops_the_run_at_that_step_with_the_previous_checkpoint_intact(
        policy, two_groups, tmp_path):
    buffer, (a, b) = two_groups
    append_group(buffer, a, 3), append_group(buffer, b, 4)
    # a checkpoint's size on disk depends on how well its state compresses (zero moments compress well), so the
    # disk is sized from the same run's first step: its whole workdir and half of one more checkpoint
    run(1, tmp_path / "probe", policy, buffer)
    first = _kib(tmp_path / "probe")
    checkpoint = _kib(tmp_path / "probe" / "checkpoints" / "1")
    with tmpfs(tmp_path / "disk", first + checkpoint // 2) as disk:   # room for step 1's checkpoint, not step 2's
        workdir = os.path.join(disk, "run")
        with pytest.raises(CheckpointError, match=r"checkpoint of step 2 (not written|could not be written)") as err:
            run(2, workdir, policy, buffer)
        assert "\n" not in str(err.value) and "step 1" in str(err.value)
        checkpoints = os.path.join(workdir, "checkpoints")
        assert sorted(os.listdir(checkpoints)) == ["1"]         # nothing half-written left; step 1 is whole
        assert [r["step"] for r in read_metrics(workdir)] == [1, 2]
        with open(os.path.join(checkpoints, "1", "meta", "metadata")) as f:
            assert json.load(f)["step"] == 1
        assert Checkpointer(checkpoints, async_save=False).all_steps() == [1]


def test_a_run_whose_episodes_are_all_cut_stops_naming_the_cause_and_the_knob(policy, tmp_path):  # noqa: F811
    """Issue 32.2: max_seq_len below the toy's later steps cut every episode, scored 0, and the run spun forever;
    now the cut episodes are excluded and the trainer stops, in one line, before any train step."""
    probe = RingBuffer.create(str(tmp_path / "probe"), capacity_steps=64, max_seq_len=512,
                              screenshot_shape=(64, 64, 3), max_images_per_step=1)
    play_toy(probe, groups=1, group_size=1)
    first = probe.read().episodes[0].steps[0].num_tokens
    short = RingBuffer.create(str(tmp_path / "short"), capacity_steps=256, max_seq_len=first + 5,
                              screenshot_shape=(64, 64, 3), max_images_per_step=1)
    play_toy(short, groups=3, group_size=2)   # every episode cut before its second step
    config = toy_config(4)
    config.train.stop_after_unusable_episodes = 6
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=short, weight_sink=FiniteSink())
    with pytest.raises(CannotTrain, match=r"the last 6 episodes were all cut: .*buffer.max_seq_len=") as err:
        trainer.run()
    assert "train.stop_after_unusable_episodes=6" in str(err.value) and "\n" not in str(err.value)
    assert trainer.state.step == 0 and trainer.gatherer.counts.episodes_seen == 6
    # issue 44.6: a run stopped at step 0 still leaves its counts in metrics.jsonl, not an empty file
    (record,) = read_metrics(str(tmp_path / "run"), stopped=True)
    assert record["step"] == 0 and record["rollout/cut_episodes"] == 6 and record["rollout/episodes_seen"] == 6
    assert record["rollout/cut_steps"] == 6 and record["stopped"].startswith("CannotTrain: the last 6 episodes")
    assert read_metrics(str(tmp_path / "run")) == []                # no train step: the readers of steps see none


def test_a_run_whose_evaluator_is_never_satisfied_stops_in_one_line(policy, two_groups, tmp_path):  # noqa: F811
    """Issue 44.4: every group failed (an evaluator never satisfied), dynamic sampling dropped them all, and the run
    waited for ever with 0 train steps; now the trainer stops once the last N groups each got one reward."""
    buffer, (a, b) = two_groups    # then three failed groups: the first read holds all five, the check comes first
    failed = lambda e: dataclasses.replace(e, reward=0.0, terminated=False, truncated=True)   # noqa: E731
    for group_id in range(10, 13):
        append_group(buffer, a if group_id % 2 else b, group_id, failed)
    config = toy_config(4)
    config.train.dynamic_sampling, config.train.stop_after_uniform_groups = True, 3
    trainer = Trainer(config, str(tmp_path / "run"), policy=policy, buffer=buffer, weight_sink=FiniteSink())
    with pytest.raises(CannotTrain, match=r"the last [35] groups each got one reward \(success rate 0% ") as err:
        trainer.run()
    assert "never satisfied" in str(err.value) and "train.stop_after_uniform_groups=3" in str(err.value)
    assert "\n" not in str(err.value) and trainer.state.step == 0
    (record,) = read_metrics(str(tmp_path / "run"), stopped=True)
    assert record["rollout/episodes_seen"] == 10 and record["rollout/env_failed"] == 0


def test_cut_episodes_are_not_trained_and_counted_in_metrics_jsonl(policy, two_groups, tmp_path):  # noqa: F811
    """A cut episode (a step outgrew max_seq_len) is excluded like an env-failed one and counted, never a 0."""
    buffer, (a, b) = two_groups
    cut = append_group(buffer, a, 1, lambda e: dataclasses.replace(e, cut=True, reward=0.0))   # batch 2 meets it
    append_group(buffer, a, 2), append_group(buffer, b, 3)
    run(2, tmp_path / "run", policy, buffer)
    first, record = read_metrics(str(tmp_path / "run"))
    assert first["rollout/cut_episodes"] == 0 and record["rollout/cut_episodes"] == len(cut) == 2
    assert record["rollout/cut_steps"] == sum(e.num_steps for e in a)
    assert not set(trained_ids(tmp_path / "run")) & set(cut)
