"""Deterministic episodes for buffer tests: the same seed always gives the same episode, so a reader
in another process can check every byte it gets back."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxwebrl.buffer.episode import Episode, MemoryStats, Step

SHAPE = (12, 16, 3)


def make_steps(seed: int, *, num_steps: int | None = None, shape=SHAPE, max_len: int = 48, version: int = 5,
               with_memory: bool = True, images_per_step: int = 2) -> tuple[list[Step], np.ndarray]:
    """(steps with local screenshot refs, the screenshots uint8 [S + 1, *shape]) of `make_episode`."""
    rng = np.random.default_rng(seed)
    S = num_steps or int(rng.integers(1, 5))
    tokens = []
    for j in range(S):
        L = int(rng.integers(8, max_len + 1))
        n_policy = int(rng.integers(1, L // 2 + 1))
        m = np.r_[np.zeros(L - n_policy), np.ones(n_policy)].astype(np.int8)
        tokens.append(dict(input_ids=rng.integers(0, 1000, L).astype(np.int32), loss_mask=m,
                           behave_logprobs=np.where(m > 0, -rng.random(L) * 3, 0).astype(np.float32),
                           versions=np.where(m > 0, version + (j % 2), -1).astype(np.int32)))
    n_images = S + 1
    screenshots = rng.integers(0, 256, (n_images,) + tuple(shape)).astype(np.uint8)
    if n_images > 2:
        screenshots[2] = screenshots[1]  # unchanged screenshot: must share one slot
    refs = np.full((S, images_per_step), -1, np.int64)
    for j in range(S):
        refs[j, 0] = j + 1
        if images_per_step > 1 and j > 0:
            refs[j, 1] = j
    changed = rng.random(S) > 0.3
    memory = (rng.integers(0, 500, S), rng.integers(0, 9, S), rng.random(S))
    steps = [Step(**tokens[j], screenshot_refs=refs[j], screenshot_changed=bool(changed[j]),
                  memory=MemoryStats(int(memory[0][j]), int(memory[1][j]), float(memory[2][j])) if with_memory
                  else None) for j in range(S)]
    return steps, screenshots


def make_episode(seed: int, *, num_steps: int | None = None, shape=SHAPE, max_len: int = 48,
                 version: int = 5, group_id: int | None = None, with_memory: bool = True,
                 images_per_step: int = 2, **fields) -> Episode:
    """An Episode with local screenshots (repeats included, to exercise dedup) and memory stats; `fields`
    override the Episode's own fields."""
    steps, screenshots = make_steps(seed, num_steps=num_steps, shape=shape, max_len=max_len, version=version,
                                    with_memory=with_memory, images_per_step=images_per_step)
    reward = float(np.random.default_rng([seed, 1]).random())
    values = dict(steps=tuple(steps), screenshots=screenshots,
                  group_id=int(seed // 4 if group_id is None else group_id), task_id=f"test/task-{seed % 3}",
                  reward=reward, terminated=bool(seed % 2), truncated=not bool(seed % 2), env_failed=False,
                  info={"seed": int(seed)})
    values.update(fields)
    return Episode(**values)


def with_steps(episode: Episode, j: int, **changes) -> Episode:
    """`episode` with step j's fields replaced (the Episode constructor checks the result)."""
    steps = list(episode.steps)
    steps[j] = dataclasses.replace(steps[j], **changes)
    return dataclasses.replace(episode, steps=tuple(steps))


def assert_same_episode(got: Episode, sent: Episode, store) -> None:
    """`got` (read back) equals `sent` but for the buffer's episode id and the refs, which are global in `got`
    (their pixels fetched by reference) and local into `sent.screenshots` (or global too when it has none)."""
    assert got.episode_id is not None and got.screenshots is None
    stored = dataclasses.replace(sent, episode_id=got.episode_id, screenshots=None,
                                 steps=tuple(dataclasses.replace(s, screenshot_refs=g.screenshot_refs)
                                             for s, g in zip(sent.steps, got.steps)))
    assert got == stored
    refs, sent_refs = got.screenshot_refs, sent.screenshot_refs
    np.testing.assert_array_equal(refs < 0, sent_refs < 0)
    if sent.screenshots is None:
        np.testing.assert_array_equal(refs, sent_refs)
    for j, k in zip(*np.nonzero(refs >= 0)):
        sent_ref = int(sent_refs[j, k])
        expected = sent.screenshots[sent_ref] if sent.screenshots is not None else store.get(sent_ref)
        np.testing.assert_array_equal(store.get(int(refs[j, k])), expected)
