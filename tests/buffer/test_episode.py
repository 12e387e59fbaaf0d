"""The typed Episode: its constructor refuses every broken invariant by name, a written and read-back Episode is
equal, and a buffer written before the type existed (tests/data/buffer_format2) reads as Episodes."""

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest

from jaxwebrl.buffer.episode import Episode, EpisodeError, MemoryStats, Step
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.buffer.rows import from_rows
from tests.buffer.factory import SHAPE, make_episode, with_steps

DATA = pathlib.Path(__file__).parent.parent / "data"


def _step(ep, j, key, index, value):
    array = getattr(ep.steps[j], key).copy()
    array[index] = value
    return with_steps(ep, j, **{key: array})


BROKEN = {
    "logprob on a prompt token": (lambda ep: _step(ep, 1, "behave_logprobs", 0, -0.5), "step 1: .*prompt tokens"),
    "missing logprob": (lambda ep: _step(ep, 0, "behave_logprobs", -1, np.nan), "step 0: .*finite"),
    "positive logprob": (lambda ep: _step(ep, 2, "behave_logprobs", -1, 0.5), "step 2: .*<= 0"),
    "missing version": (lambda ep: _step(ep, 2, "versions", -1, -1), "step 2: .*policy version"),
    "version on a prompt token": (lambda ep: _step(ep, 0, "versions", 0, 3), "step 0: versions must be -1"),
    "ragged step": (lambda ep: with_steps(ep, 0, loss_mask=ep.steps[0].loss_mask[:-1]), "one length"),
    "no action": (lambda ep: with_steps(ep, 1, loss_mask=np.zeros_like(ep.steps[1].loss_mask)),
                  "step 1: no policy"),
    "loss mask not 0/1": (lambda ep: _step(ep, 0, "loss_mask", 0, 2), "step 0: loss_mask must be in"),
    "float ids": (lambda ep: with_steps(ep, 0, input_ids=ep.steps[0].input_ids.astype(np.float32)), "integer"),
    "negative id": (lambda ep: _step(ep, 0, "input_ids", 0, -3), "step 0: input_ids must be in"),
    "id past int32": (lambda ep: with_steps(ep, 0, input_ids=ep.steps[0].input_ids.astype(np.int64) + 2**31),
                      "input_ids must be in"),
    "refs of two widths": (lambda ep: with_steps(ep, 1, screenshot_refs=np.array([1])), "one width"),
    "ref below -1": (lambda ep: _step(ep, 0, "screenshot_refs", 0, -2), "screenshot_refs must be in"),
    "ref past the screenshots": (lambda ep: _step(ep, 0, "screenshot_refs", 0, 99), "index past"),
    "no steps": (lambda ep: dataclasses.replace(ep, steps=()), "at least one step"),
    "a dict for a step": (lambda ep: dataclasses.replace(ep, steps=({"input_ids": []},)), "must be a .*Step"),
    "reward per step": (lambda ep: dataclasses.replace(ep, reward=np.ones(3)), "one finite number per episode"),
    "infinite reward": (lambda ep: dataclasses.replace(ep, reward=float("inf")), "reward"),
    "terminated per step": (lambda ep: dataclasses.replace(ep, terminated=np.array([False, False, True])),
                            "one bool per episode"),
    "empty task": (lambda ep: dataclasses.replace(ep, task_id=""), "task_id"),
    "group id per step": (lambda ep: dataclasses.replace(ep, group_id=np.array([1, 1, 2])), "group_id"),
    "group id past int64": (lambda ep: dataclasses.replace(ep, group_id=2**63), "group_id must be in"),
    "info not json": (lambda ep: dataclasses.replace(ep, info={"array": np.zeros(2)}), "JSON-serialisable"),
    "screenshots not uint8": (lambda ep: dataclasses.replace(ep, screenshots=ep.screenshots.astype(np.float32)),
                              "screenshots must be uint8"),
    "memory not MemoryStats": (lambda ep: with_steps(ep, 0, memory={"chars": 3}), "MemoryStats"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_constructor_refuses_each_broken_invariant_by_name(name):
    good = make_episode(5, num_steps=3)
    broken, message = BROKEN[name]
    with pytest.raises(EpisodeError, match=message):
        broken(good)


def test_memory_stats_refuse_out_of_range_values():
    with pytest.raises(EpisodeError, match="generic_frac must be in"):
        MemoryStats(3, 1, 1.5)
    with pytest.raises(EpisodeError, match="chars must be in"):
        MemoryStats(-1, 1, 0.5)


def test_the_constructor_normalises_dtypes_and_derives_the_versions():
    ep = make_episode(2, num_steps=3, version=7)
    step = Step(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behave_logprobs=[0.0, -0.5, -1.0], versions=[-1, 7, 8])
    one = Episode(steps=[step], task_id="toy", group_id=np.int64(3), reward=np.float32(1.0), terminated=True)
    s = one.steps[0]
    assert (s.input_ids.dtype, s.loss_mask.dtype, s.behave_logprobs.dtype, s.versions.dtype,
            s.screenshot_refs.dtype) == (np.int32, np.int8, np.float32, np.int32, np.int64)
    assert isinstance(one.steps, tuple) and type(one.group_id) is int and type(one.reward) is float
    assert (one.num_steps, one.min_version, one.max_version) == (1, 7, 8)
    assert (ep.num_steps, ep.min_version, ep.max_version) == (3, 7, 8)
    assert ep == make_episode(2, num_steps=3, version=7) and ep != make_episode(3, num_steps=3, version=7)


@pytest.mark.parametrize("memory, cut", [(True, False), (False, False), (True, True)])
def test_a_written_and_read_back_episode_is_equal(tmp_path, memory, cut):
    buf = RingBuffer.create(tmp_path / "buf", capacity_steps=32, max_seq_len=48, screenshot_shape=SHAPE,
                            max_images_per_step=2)
    local = make_episode(7, num_steps=3, with_memory=memory)
    refs = np.array([buf.screenshots.put(image) for image in local.screenshots])
    sent = dataclasses.replace(local, screenshots=None, cut=cut, steps=tuple(
        dataclasses.replace(s, screenshot_refs=np.where(s.screenshot_refs >= 0, refs[s.screenshot_refs], -1))
        for s in local.steps))
    episode_id = buf.append(sent)
    got = RingBuffer.open(tmp_path / "buf").read().episodes[0]
    assert got.episode_id == episode_id and got == dataclasses.replace(sent, episode_id=episode_id)
    assert got.min_version == sent.min_version and got.num_steps == 3 and got.cut == cut


def test_rows_that_disagree_on_the_reward_are_counted_corrupt(tmp_path, caplog):
    """Rows repeat the episode's one reward: rows that carry two (valid checksums, so damage at write time or a
    foreign writer) make the episode corrupt, counted and logged, never a half-believed reward."""
    from jaxwebrl.buffer.schema import row_checksums
    buf = RingBuffer.create(tmp_path / "buf", capacity_steps=32, max_seq_len=48, screenshot_shape=SHAPE,
                            max_images_per_step=2)
    buf.append(make_episode(1, num_steps=2))
    (rec,) = buf.log.read_range(0, 1)
    (rows, _), = buf.load_rows([rec])
    rows = rows.copy()
    rows["reward"][1] += 1
    rows["checksum"] = row_checksums(rows, buf.config)
    with pytest.raises(EpisodeError, match="different rewards"):
        from_rows(rows, rec)
    buf._rows.array[1].write(rows[1:2].view(np.uint8)).result()
    result = buf.read()
    assert result.episodes == [] and result.stats["corrupt"] == 1


def test_the_committed_format_2_buffer_reads_as_episodes(tmp_path):
    """tests/data/buffer_format2 was written by the dict-based code before Episode existed; it reads back as
    Episodes holding exactly what that code read (tests/data/buffer_format2_expected.json)."""
    path = tmp_path / "old"
    shutil.copytree(DATA / "buffer_format2", path)
    buf = RingBuffer.open(path)
    got = buf.read().episodes
    expected = json.loads((DATA / "buffer_format2_expected.json").read_text())
    assert len(got) == len(expected) == 3
    for ep, old in zip(got, expected):
        assert isinstance(ep, Episode)
        assert (ep.episode_id, ep.task_id, ep.group_id, ep.info, ep.min_version) == (
            old["episode_id"], old["task_id"], old["group_id"], old["info"], old["min_version"])
        assert ep.num_steps == len(old["input_ids"]) == old["num_steps"][0]
        assert [ep.reward] * ep.num_steps == pytest.approx(old["reward"])
        assert (ep.terminated, ep.truncated, ep.env_failed) == (old["terminated"][-1], old["truncated"][-1],
                                                               old["env_failed"][-1])
        assert not ep.cut   # FLAG_CUT is a bit no format-2 writer set before it existed: the format stays 2
        for j, step in enumerate(ep.steps):
            for key in ("input_ids", "loss_mask", "behave_logprobs", "versions"):
                np.testing.assert_array_equal(getattr(step, key), old[key][j], err_msg=key)
            np.testing.assert_array_equal(step.screenshot_refs, old["screenshot_refs"][j])
            assert step.screenshot_changed == old["screenshot_changed"][j]
            if "memory_chars" in old:
                assert (step.memory.chars, step.memory.keys) == (old["memory_chars"][j], old["memory_keys"][j])
                assert step.memory.generic_frac == pytest.approx(old["memory_generic_frac"][j])
            else:
                assert step.memory is None
        pixels = [buf.screenshots.get(int(r)).tolist() if r >= 0 else None for r in ep.screenshot_refs.reshape(-1)]
        assert pixels == old["pixels"]
    assert buf.append(dataclasses.replace(got[0], episode_id=None)) > got[-1].episode_id   # and takes new ones
