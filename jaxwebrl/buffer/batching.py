"""Batch assembly: the steps of Episodes -> padded [B, T] arrays or packed sequences, built once from Episode.steps.

    batch = pad_steps(episodes, seq_len=512, batch_size=8)        # one row per step, padded [B, T]
    packed = pack_steps(episodes, seq_len=4096)                    # [B, T] with segment_ids
    images, image_index = gather_screenshots(buf.screenshots, batch["screenshot_refs"])

Rows are the episodes' steps in order (episode 0's steps, then episode 1's, ...). Padding conventions: input_ids
pad_id, loss_mask 0, behave_logprobs 0, versions -1, refs -1. Step-level scalars (reward, episode_id, ...) are
[B] in padded batches and broadcast per token ([B, T], 0 on padding) in packed ones, where a row holds several
steps. The episodes must come from `RingBuffer.read` (their episode_id is set).
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.buffer.episode import TOKEN_DTYPES, TOKEN_FIELDS, Episode

STEP_SCALARS = {"episode_id": np.int64, "group_id": np.int64, "step_index": np.int32, "num_steps": np.int32,
                "reward": np.float32, "terminated": np.bool_, "truncated": np.bool_, "env_failed": np.bool_}
TOKEN_PAD = {"input_ids": 0, "loss_mask": 0, "behave_logprobs": 0.0, "versions": -1}


def _steps(episodes: list[Episode]) -> list:
    """The (episode, step index, Step) of every step, in row order."""
    out = []
    for ep in episodes:
        if ep.episode_id is None:
            raise ValueError(f"an episode of {ep.task_id} has no episode_id: batch episodes read from the buffer "
                             f"(RingBuffer.read sets it)")
        out += [(ep, j, step) for j, step in enumerate(ep.steps)]
    return out


def _step_scalars(ep: Episode, j: int) -> dict:
    """STEP_SCALARS of step j of `ep` (terminated / truncated only on the last step)."""
    last = j == ep.num_steps - 1
    return {"episode_id": ep.episode_id, "group_id": ep.group_id, "step_index": j, "num_steps": ep.num_steps,
            "reward": ep.reward, "terminated": ep.terminated and last, "truncated": ep.truncated and last,
            "env_failed": ep.env_failed}


def _refs_matrix(refs_list: list[np.ndarray]) -> np.ndarray:
    width = max([1] + [len(r) for r in refs_list])
    out = np.full((len(refs_list), width), -1, np.int64)
    for i, refs in enumerate(refs_list):
        out[i, :len(refs)] = refs
    return out


def pad_steps(episodes: list[Episode], *, seq_len: int | None = None, batch_size: int | None = None,
              pad_id: int = 0) -> dict:
    """Pads the episodes' steps into one batch, a row per step.

    Returns input_ids [B, T] int32, loss_mask [B, T] int8, behave_logprobs [B, T] float32,
    versions [B, T] int32, attention_mask [B, T] int8, seq_lens [B] int32, row_valid [B] bool,
    screenshot_refs [B, K] int64, task_id list[str] and STEP_SCALARS [B]. T = seq_len or the longest
    step; B = batch_size (extra rows are all padding, row_valid False) or the number of steps.
    """
    steps = _steps(episodes)
    B = batch_size or len(steps)
    if len(steps) > B:
        raise ValueError(f"{len(steps)} steps do not fit batch_size={B}")
    lengths = np.array([step.num_tokens for _, _, step in steps], np.int32)
    T = seq_len or int(lengths.max(initial=1))
    if (lengths > T).any():
        raise ValueError(f"a step of {int(lengths.max())} tokens does not fit seq_len={T}; raise seq_len")
    batch = {key: np.full((B, T), TOKEN_PAD[key] if key != "input_ids" else pad_id, TOKEN_DTYPES[key])
             for key in TOKEN_FIELDS}
    batch.update({key: np.zeros(B, dtype) for key, dtype in STEP_SCALARS.items()})
    for i, (ep, j, step) in enumerate(steps):
        for key in TOKEN_FIELDS:
            batch[key][i, :lengths[i]] = getattr(step, key)
        for key, value in _step_scalars(ep, j).items():
            batch[key][i] = value
    batch["seq_lens"] = np.zeros(B, np.int32)
    batch["seq_lens"][:len(steps)] = lengths
    batch["attention_mask"] = (np.arange(T)[None, :] < batch["seq_lens"][:, None]).astype(np.int8)
    batch["row_valid"] = np.arange(B) < len(steps)
    refs = _refs_matrix([step.screenshot_refs for _, _, step in steps])
    batch["screenshot_refs"] = np.full((B, refs.shape[1]), -1, np.int64)
    batch["screenshot_refs"][:len(steps)] = refs
    batch["task_id"] = [ep.task_id for ep, _, _ in steps] + [""] * (B - len(steps))
    return batch


def pack_steps(episodes: list[Episode], *, seq_len: int, num_rows: int | None = None, pad_id: int = 0) -> dict:
    """Packs the episodes' steps into [B, T=seq_len] sequences (first-fit decreasing), segments never split.

    Returns the token fields [B, T], segment_ids [B, T] int32 (1.. per sequence, 0 on padding),
    positions [B, T] int32 (restart at 0 in every segment), STEP_SCALARS broadcast per token [B, T],
    segment_row [B, M] int64 (index of the step in row order, -1 empty) and segment_refs [B, M, K] int64.
    B = num_rows (error if the steps do not fit) or as many as needed.
    """
    steps = _steps(episodes)
    lengths = np.array([step.num_tokens for _, _, step in steps], np.int64)
    if (lengths > seq_len).any():
        raise ValueError(f"a step of {int(lengths.max())} tokens does not fit seq_len={seq_len}")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        slot = next((b for b, room in enumerate(free) if room >= lengths[i]), None)
        if slot is None:
            bins.append([])
            free.append(seq_len)
            slot = len(bins) - 1
        bins[slot].append(int(i))
        free[slot] -= int(lengths[i])
    B = num_rows or max(1, len(bins))
    if len(bins) > B:
        raise ValueError(f"the steps need {len(bins)} packed sequences of {seq_len} tokens, only num_rows={B} allowed")
    out = {key: np.full((B, seq_len), TOKEN_PAD[key] if key != "input_ids" else pad_id, TOKEN_DTYPES[key])
           for key in TOKEN_FIELDS}
    out["segment_ids"] = np.zeros((B, seq_len), np.int32)
    out["positions"] = np.zeros((B, seq_len), np.int32)
    for key, dtype in STEP_SCALARS.items():
        out[key] = np.zeros((B, seq_len), dtype)
    M = max([1] + [len(members) for members in bins])
    refs = _refs_matrix([step.screenshot_refs for _, _, step in steps]) if steps else np.full((0, 1), -1, np.int64)
    out["segment_row"] = np.full((B, M), -1, np.int64)
    out["segment_refs"] = np.full((B, M, refs.shape[1]), -1, np.int64)
    for b, members in enumerate(bins):
        offset = 0
        for m, i in enumerate(sorted(members)):
            L = int(lengths[i])
            span = slice(offset, offset + L)
            ep, j, step = steps[i]
            for key in TOKEN_FIELDS:
                out[key][b, span] = getattr(step, key)
            out["segment_ids"][b, span] = m + 1
            out["positions"][b, span] = np.arange(L)
            for key, value in _step_scalars(ep, j).items():
                out[key][b, span] = value
            out["segment_row"][b, m] = i
            out["segment_refs"][b, m] = refs[i]
            offset += L
    return out


def gather_screenshots(store, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fetches each distinct ref of `refs` (any shape, int64, -1 padding) once.

    Returns (images uint8 [U, H, W, 3], image_index with refs' shape: position in images, -1 on padding).
    """
    refs = np.asarray(refs, np.int64)
    unique, inverse = np.unique(refs, return_inverse=True)
    valid = unique >= 0
    images = store.get_many(unique[valid]) if valid.any() else np.zeros(
        (0,) + tuple(store.config.screenshot_shape), np.uint8)
    position = np.cumsum(valid) - 1
    index = np.where(valid[inverse], position[inverse], -1).reshape(refs.shape)
    return images, index.astype(np.int64)
