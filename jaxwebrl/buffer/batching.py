"""Batch assembly: episodes -> step rows -> padded [B, T] batches (bucketed by length) or packed sequences.

    rows = episodes_to_rows(episodes)                              # one dict per browser step
    batches = bucket_batches(rows, batch_size=8)                   # list of padded [B, T] dicts
    packed = pack_rows(rows, seq_len=4096)                         # [B, T] with segment_ids
    images, image_index = gather_screenshots(buf.screenshots, batch["screenshot_refs"])

Padding conventions: input_ids pad_id, loss_mask 0, behave_logprobs 0, versions -1, refs -1.
Step-level scalars (reward, episode_id, ...) are [B] in padded batches and broadcast per token
([B, T], 0 on padding) in packed ones, where a row holds several steps.
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.buffer.episodes import TOKEN_KEYS

STEP_SCALARS = {"episode_id": np.int64, "group_id": np.int64, "step_index": np.int32, "num_steps": np.int32,
                "reward": np.float32, "terminated": np.bool_, "truncated": np.bool_, "env_failed": np.bool_}
TOKEN_PAD = {"input_ids": 0, "loss_mask": 0, "behave_logprobs": 0.0, "versions": -1}
TOKEN_DTYPES = {"input_ids": np.int32, "loss_mask": np.int8, "behave_logprobs": np.float32, "versions": np.int32}


def episodes_to_rows(episodes: list[dict]) -> list[dict]:
    """One dict per step: token arrays [L_j], screenshot_refs [K] int64, task_id, and STEP_SCALARS."""
    rows = []
    for ep in episodes:
        S = len(ep["input_ids"])
        for j in range(S):
            row = {key: np.asarray(ep[key][j], TOKEN_DTYPES[key]) for key in TOKEN_KEYS}
            row["screenshot_refs"] = np.asarray(ep["screenshot_refs"][j], np.int64)
            row["task_id"] = ep["task_id"]
            for key, dtype in STEP_SCALARS.items():
                value = np.asarray(ep[key])
                row[key] = dtype(value if value.ndim == 0 else value[j])
            rows.append(row)
    return rows


def _refs_matrix(refs_list: list[np.ndarray]) -> np.ndarray:
    width = max([1] + [len(r) for r in refs_list])
    out = np.full((len(refs_list), width), -1, np.int64)
    for i, refs in enumerate(refs_list):
        out[i, :len(refs)] = refs
    return out


def pad_batch(rows: list[dict], *, seq_len: int | None = None, batch_size: int | None = None,
              pad_id: int = 0) -> dict:
    """Pads rows into one batch.

    Returns input_ids [B, T] int32, loss_mask [B, T] int8, behave_logprobs [B, T] float32,
    versions [B, T] int32, attention_mask [B, T] int8, seq_lens [B] int32, row_valid [B] bool,
    screenshot_refs [B, K] int64, task_id list[str] and STEP_SCALARS [B]. T = seq_len or the longest
    row; B = batch_size (extra rows are all padding, row_valid False) or len(rows).
    """
    B = batch_size or len(rows)
    if len(rows) > B:
        raise ValueError(f"{len(rows)} rows do not fit batch_size={B}")
    lengths = np.array([len(r["input_ids"]) for r in rows], np.int32)
    T = seq_len or int(lengths.max(initial=1))
    if (lengths > T).any():
        raise ValueError(f"a row of {int(lengths.max())} tokens does not fit seq_len={T}; raise seq_len")
    batch = {key: np.full((B, T), TOKEN_PAD[key] if key != "input_ids" else pad_id, TOKEN_DTYPES[key])
             for key in TOKEN_KEYS}
    for i, row in enumerate(rows):
        for key in TOKEN_KEYS:
            batch[key][i, :lengths[i]] = row[key]
    batch["seq_lens"] = np.zeros(B, np.int32)
    batch["seq_lens"][:len(rows)] = lengths
    batch["attention_mask"] = (np.arange(T)[None, :] < batch["seq_lens"][:, None]).astype(np.int8)
    batch["row_valid"] = np.arange(B) < len(rows)
    refs = _refs_matrix([r["screenshot_refs"] for r in rows])
    batch["screenshot_refs"] = np.full((B, refs.shape[1]), -1, np.int64)
    batch["screenshot_refs"][:len(rows)] = refs
    batch["task_id"] = [r["task_id"] for r in rows] + [""] * (B - len(rows))
    for key, dtype in STEP_SCALARS.items():
        batch[key] = np.zeros(B, dtype)
        batch[key][:len(rows)] = [r[key] for r in rows]
    return batch


def default_buckets(max_len: int, smallest: int = 64) -> list[int]:
    """Powers of two from `smallest` up to (and including) max_len."""
    buckets, b = [], smallest
    while b < max_len:
        buckets.append(b)
        b *= 2
    return buckets + [max_len]


def bucket_batches(rows: list[dict], *, batch_size: int, buckets: list[int] | None = None,
                   pad_id: int = 0) -> list[dict]:
    """Groups rows by length bucket (smallest bucket >= length) and pads each chunk of batch_size.

    Every batch is [batch_size, bucket] so jit sees one shape per bucket; short final chunks are
    completed with padding rows (row_valid False). Each batch also carries `row_index` [B] int64
    (position in `rows`, -1 on padding).
    """
    if not rows:
        return []
    lengths = np.array([len(r["input_ids"]) for r in rows])
    buckets = sorted(buckets or default_buckets(int(lengths.max())))
    if lengths.max() > buckets[-1]:
        raise ValueError(f"a row of {int(lengths.max())} tokens exceeds the largest bucket {buckets[-1]}")
    which = np.searchsorted(buckets, lengths)  # first bucket >= length
    batches = []
    for b, bucket_len in enumerate(buckets):
        members = np.flatnonzero(which == b)
        for start in range(0, len(members), batch_size):
            chunk = members[start:start + batch_size]
            batch = pad_batch([rows[i] for i in chunk], seq_len=bucket_len, batch_size=batch_size, pad_id=pad_id)
            batch["row_index"] = np.full(batch_size, -1, np.int64)
            batch["row_index"][:len(chunk)] = chunk
            batches.append(batch)
    return batches


def pack_rows(rows: list[dict], *, seq_len: int, num_rows: int | None = None, pad_id: int = 0) -> dict:
    """Packs step rows into [B, T=seq_len] sequences (first-fit decreasing), segments never split.

    Returns the TOKEN_KEYS [B, T], segment_ids [B, T] int32 (1.. per sequence, 0 on padding),
    positions [B, T] int32 (restart at 0 in every segment), STEP_SCALARS broadcast per token [B, T],
    segment_row [B, M] int64 (index into `rows`, -1 empty) and segment_refs [B, M, K] int64.
    B = num_rows (error if the rows do not fit) or as many as needed.
    """
    lengths = np.array([len(r["input_ids"]) for r in rows], np.int64)
    if (lengths > seq_len).any():
        raise ValueError(f"a row of {int(lengths.max())} tokens does not fit seq_len={seq_len}")
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
        raise ValueError(f"rows need {len(bins)} packed sequences of {seq_len} tokens, only num_rows={B} allowed")
    out = {key: np.full((B, seq_len), TOKEN_PAD[key] if key != "input_ids" else pad_id, TOKEN_DTYPES[key])
           for key in TOKEN_KEYS}
    out["segment_ids"] = np.zeros((B, seq_len), np.int32)
    out["positions"] = np.zeros((B, seq_len), np.int32)
    for key, dtype in STEP_SCALARS.items():
        out[key] = np.zeros((B, seq_len), dtype)
    M = max([1] + [len(members) for members in bins])
    refs = _refs_matrix([r["screenshot_refs"] for r in rows]) if rows else np.full((0, 1), -1, np.int64)
    out["segment_row"] = np.full((B, M), -1, np.int64)
    out["segment_refs"] = np.full((B, M, refs.shape[1]), -1, np.int64)
    for b, members in enumerate(bins):
        offset = 0
        for m, i in enumerate(sorted(members)):
            L = int(lengths[i])
            span = slice(offset, offset + L)
            for key in TOKEN_KEYS:
                out[key][b, span] = rows[i][key]
            out["segment_ids"][b, span] = m + 1
            out["positions"][b, span] = np.arange(L)
            for key in STEP_SCALARS:
                out[key][b, span] = rows[i][key]
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
