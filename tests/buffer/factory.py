"""Deterministic episodes for buffer tests: the same seed always gives the same episode, so a reader
in another process can check every byte it gets back."""

from __future__ import annotations

import numpy as np

SHAPE = (12, 16, 3)


def make_episode(seed: int, *, num_steps: int | None = None, shape=SHAPE, max_len: int = 48,
                 version: int = 5, group_id: int | None = None, with_memory=True,
                 images_per_step: int = 2) -> dict:
    """An episode with local screenshots (repeats included, to exercise dedup) and every optional key."""
    rng = np.random.default_rng(seed)
    S = num_steps or int(rng.integers(1, 5))
    ids, mask, logp, vers = [], [], [], []
    for j in range(S):
        L = int(rng.integers(8, max_len + 1))
        n_policy = int(rng.integers(1, L // 2 + 1))
        m = np.r_[np.zeros(L - n_policy), np.ones(n_policy)].astype(np.int8)
        ids.append(rng.integers(0, 1000, L).astype(np.int32))
        mask.append(m)
        logp.append(np.where(m > 0, -rng.random(L) * 3, 0).astype(np.float32))
        vers.append(np.where(m > 0, version + (j % 2), -1).astype(np.int32))
    n_images = S + 1
    screenshots = rng.integers(0, 256, (n_images,) + tuple(shape)).astype(np.uint8)
    if n_images > 2:
        screenshots[2] = screenshots[1]  # unchanged screenshot: must share one slot
    refs = np.full((S, images_per_step), -1, np.int64)
    for j in range(S):
        refs[j, 0] = j + 1
        if images_per_step > 1 and j > 0:
            refs[j, 1] = j
    episode = {
        "input_ids": ids, "loss_mask": mask, "behave_logprobs": logp, "versions": vers,
        "screenshot_refs": refs, "screenshots": screenshots,
        "screenshot_changed": rng.random(S) > 0.3,
        "step_index": np.arange(S, dtype=np.int32), "num_steps": np.full(S, S, np.int32),
        "group_id": int(seed // 4 if group_id is None else group_id), "task_id": f"test/task-{seed % 3}",
        "reward": np.float32(rng.random()), "terminated": bool(seed % 2), "truncated": not bool(seed % 2),
        "env_failed": False, "info": {"seed": int(seed)},
    }
    memory = {"memory_chars": rng.integers(0, 500, S).astype(np.int32),
              "memory_keys": rng.integers(0, 9, S).astype(np.int32),
              "memory_generic_frac": rng.random(S).astype(np.float32)}
    for key in (memory if with_memory is True else with_memory or ()):
        episode[key] = memory[key]
    return episode


def assert_same_episode(got: dict, sent: dict, store) -> None:
    """Every field of `sent` comes back in `got` (pixels fetched by reference)."""
    S = len(sent["input_ids"])
    for key in ("input_ids", "loss_mask", "behave_logprobs", "versions"):
        assert len(got[key]) == S
        for j in range(S):
            np.testing.assert_array_equal(got[key][j], sent[key][j], err_msg=key)
            assert got[key][j].dtype == np.asarray(sent[key][j]).dtype, key
    np.testing.assert_array_equal(got["step_index"], np.arange(S))
    np.testing.assert_array_equal(got["num_steps"], np.full(S, S))
    np.testing.assert_array_equal(got["screenshot_changed"], sent["screenshot_changed"])
    np.testing.assert_allclose(got["reward"], np.full(S, sent["reward"]))
    terminal = np.zeros(S, bool)
    terminal[-1] = True
    np.testing.assert_array_equal(got["terminated"], terminal & bool(sent["terminated"]))
    np.testing.assert_array_equal(got["truncated"], terminal & bool(sent["truncated"]))
    np.testing.assert_array_equal(got["env_failed"], np.full(S, sent["env_failed"]))
    assert got["group_id"] == sent["group_id"] and got["task_id"] == sent["task_id"]
    assert got["info"] == sent["info"]
    for key in ("memory_chars", "memory_keys", "memory_generic_frac"):
        if key in sent:
            np.testing.assert_array_equal(got[key], sent[key], err_msg=key)
        else:
            assert key not in got
    refs = got["screenshot_refs"]
    assert refs.shape == sent["screenshot_refs"].shape
    np.testing.assert_array_equal(refs < 0, sent["screenshot_refs"] < 0)
    for j, k in zip(*np.nonzero(refs >= 0)):
        np.testing.assert_array_equal(store.get(int(refs[j, k])), sent["screenshots"][sent["screenshot_refs"][j, k]])
