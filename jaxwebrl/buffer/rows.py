"""The on-disk step-row codec: an Episode -> structured step rows, and rows + commit record -> an Episode.

The row format (schema.row_dtype) is unchanged since format 1: one row per step with the episode's reward and
env_failed and cut flags repeated on every row, terminated / truncated on the last one, memory stats and their
FLAG_HAS_MEMORY bits (FLAG_CUT is a bit earlier writers never set: their episodes read back with cut=False). `from_rows` checks that the repeated values agree (a row that disagrees is damage) and
builds the Episode, whose constructor checks the rest.
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.buffer.episode import TOKEN_FIELDS, Episode, EpisodeError, MemoryStats, Step
from jaxwebrl.buffer.schema import (FLAG_CUT, FLAG_ENV_FAILED, FLAG_HAS_MEMORY, FLAG_SCREENSHOT_CHANGED, FLAG_TERMINATED,
                                    FLAG_TRUNCATED, BufferConfig, row_checksums, row_dtype)

MEMORY_FLAGS = sum(FLAG_HAS_MEMORY.values())


def to_rows(ep: Episode, config: BufferConfig, first_seq: int, global_refs: np.ndarray) -> np.ndarray:
    """Step-row records of an episode: uint8 [S, row_itemsize], stamps first_seq..first_seq+S-1.
    global_refs: [S, K] int64, the steps' screenshot refs as stored (-1 padded)."""
    S = ep.num_steps
    rows = np.zeros(S, row_dtype(config))
    rows["stamp"] = first_seq + np.arange(S)
    rows["episode_id"] = first_seq
    rows["group_id"] = ep.group_id
    rows["step_index"] = np.arange(S)
    rows["num_steps"] = S
    last = np.arange(S) == S - 1
    changed = np.array([s.screenshot_changed for s in ep.steps])
    has_memory = np.array([s.memory is not None for s in ep.steps])
    rows["flags"] = (last * ep.terminated * FLAG_TERMINATED | last * ep.truncated * FLAG_TRUNCATED
                     | ep.env_failed * FLAG_ENV_FAILED | ep.cut * FLAG_CUT | changed * FLAG_SCREENSHOT_CHANGED
                     | has_memory * MEMORY_FLAGS)
    rows["reward"] = ep.reward
    for j, step in enumerate(ep.steps):
        if step.memory is not None:
            rows["memory_chars"][j], rows["memory_keys"][j] = step.memory.chars, step.memory.keys
            rows["memory_generic_frac"][j] = step.memory.generic_frac
    rows["screenshot_refs"] = -1
    rows["screenshot_refs"][:, :global_refs.shape[1]] = global_refs
    for j, step in enumerate(ep.steps):
        L = step.num_tokens
        rows["seq_len"][j] = L
        for key in TOKEN_FIELDS:
            rows[key][j, :L] = getattr(step, key)
        rows["versions"][j, L:] = -1
    if config.checksums:
        rows["checksum"] = row_checksums(rows, config)
    return rows.view(np.uint8).reshape(S, rows.dtype.itemsize)


def _corrupt(record: dict, what: str) -> None:
    raise EpisodeError(f"stored episode {record.get('episode_id')} is corrupt: {what}; it is dropped (the buffer "
                       f"counts it as corrupt)")


def from_rows(rows: np.ndarray, record: dict) -> Episode:
    """The Episode of structured rows [S] and their commit record (episode_id, task, group, info, refs width).

    Raises EpisodeError when the rows disagree with each other or break an episode invariant (damage)."""
    S = len(rows)
    flags = rows["flags"]
    if not (np.array_equal(rows["step_index"], np.arange(S)) and (rows["num_steps"] == S).all()):
        _corrupt(record, f"step_index {rows['step_index'].tolist()} / num_steps {rows['num_steps'].tolist()} "
                         f"are not 0..{S - 1} / {S}")
    reward = rows["reward"]
    if not (reward == reward[0]).all():
        _corrupt(record, f"its rows carry different rewards {reward.tolist()[:4]} (one reward per episode)")
    env_failed = (flags & FLAG_ENV_FAILED) > 0
    if env_failed.any() != env_failed.all():
        _corrupt(record, "env_failed is set on some of its rows only")
    cut = (flags & FLAG_CUT) > 0
    if cut.any() != cut.all():
        _corrupt(record, "cut is set on some of its rows only")
    ended = (flags & (FLAG_TERMINATED | FLAG_TRUNCATED)) > 0
    if ended[:-1].any():
        _corrupt(record, f"step {int(np.argmax(ended))} is terminal but steps follow it")
    K = int(record["refs_width"])
    steps = []
    for j, row in enumerate(rows):
        L = int(row["seq_len"])
        memory = None
        if flags[j] & MEMORY_FLAGS:   # format 1 and 2 writers could set a subset of the bits: absent ones are 0
            memory = MemoryStats(int(row["memory_chars"]), int(row["memory_keys"]), float(row["memory_generic_frac"]))
        steps.append(Step(**{k: np.array(row[k][:L]) for k in TOKEN_FIELDS},
                          screenshot_refs=np.array(row["screenshot_refs"][:K]),
                          screenshot_changed=bool(flags[j] & FLAG_SCREENSHOT_CHANGED), memory=memory))
    return Episode(steps=tuple(steps), task_id=record["task_id"], group_id=int(record["group_id"]),
                   reward=float(reward[0]), terminated=bool(flags[-1] & FLAG_TERMINATED),
                   truncated=bool(flags[-1] & FLAG_TRUNCATED), env_failed=bool(env_failed[-1]), cut=bool(cut[-1]),
                   info=record.get("info", {}), episode_id=int(record["episode_id"]))
