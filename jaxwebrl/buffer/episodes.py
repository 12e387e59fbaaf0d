"""Episode dicts: trajectory invariants checked on append, and conversion to / from step-row records.

An episode (docs/interfaces.md) is a dict of S per-step entries. `check_episode` refuses a bad one
with an EpisodeError naming the key, the step and the fix, before anything is written.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from jaxwebrl.buffer.schema import (FLAG_ENV_FAILED, FLAG_HAS_MEMORY, FLAG_SCREENSHOT_CHANGED, FLAG_TERMINATED,
                                    FLAG_TRUNCATED, INT32_MAX, INT64_MAX, BufferConfig, row_checksums, row_dtype)

TOKEN_KEYS = ("input_ids", "loss_mask", "behave_logprobs", "versions")
REQUIRED_KEYS = TOKEN_KEYS + ("screenshot_refs", "step_index", "num_steps", "group_id", "task_id", "reward",
                              "terminated", "truncated", "env_failed")
MEMORY_KEYS = ("memory_chars", "memory_keys", "memory_generic_frac")
# episode_id and min_version come back from `read` (taken from the commit record); on append they are ignored
OPTIONAL_KEYS = ("screenshots", "screenshot_changed", "info", "episode_id", "min_version") + MEMORY_KEYS
LOGPROB_TOLERANCE = 1e-4  # behaviour log-probs may round a hair above 0


class EpisodeError(ValueError):
    """The episode breaks a trajectory invariant; nothing was written."""


@dataclasses.dataclass
class CheckedEpisode:
    """An episode that passed every invariant, in per-step array form.

    tokens: S dicts of input_ids [L] int32, loss_mask [L] int8, behave_logprobs [L] float32, versions [L] int32.
    screenshot_refs: [S, K'] int64, -1 padded; local indices into `screenshots` when that is given.
    screenshots: uint8 [N, H, W, 3] or None.
    per_step: [S] arrays (reward, flags, memory stats, ...).
    """

    tokens: list[dict]
    screenshot_refs: np.ndarray
    screenshots: np.ndarray | None
    group_id: int
    task_id: str
    per_step: dict
    memory_keys: list  # which of MEMORY_KEYS the episode carried
    info: dict
    min_version: int
    max_version: int

    @property
    def num_steps(self) -> int:
        return len(self.tokens)


def _fail(msg: str) -> None:
    raise EpisodeError(f"episode refused: {msg}")


def _check_range(what: str, values: np.ndarray, low: int, high: int, fix: str) -> None:
    """Refuses integers outside [low, high] before any cast could wrap them (2**40 must not become 0)."""
    if values.size and (int(values.min()) < low or int(values.max()) > high):
        bad = [v for v in values.reshape(-1).tolist() if not low <= v <= high]
        _fail(f"{what} must be in [{low}, {high}], got {bad[:4]}; {fix}")


def _per_step(episode: dict, key: str, S: int, dtype, *, scalar_at_last: bool = False) -> np.ndarray:
    """A scalar-or-[S] entry as [S]; a scalar flag with scalar_at_last marks only the final step."""
    value = np.asarray(episode[key])
    if value.ndim == 0:
        if scalar_at_last:
            out = np.zeros(S, dtype)
            out[-1] = value
            return out
        return np.full(S, value, dtype)
    if value.shape != (S,):
        _fail(f"'{key}' must be a scalar or shape [{S}] (one per step), got shape {value.shape}")
    return value.astype(dtype)


def check_episode(episode: dict, config: BufferConfig) -> CheckedEpisode:
    """Validates every trajectory invariant of `episode` and returns it normalised (nothing written)."""
    if not isinstance(episode, dict):
        _fail(f"expected a dict of per-step arrays, got {type(episode).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in episode]
    if missing:
        _fail(f"missing keys {missing}; see docs/interfaces.md (jaxwebrl.buffer) for the episode format")
    unknown = sorted(set(episode) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        _fail(f"unknown keys {unknown}; put free-form JSON metadata under 'info'")
    lengths = {k: len(episode[k]) for k in TOKEN_KEYS}
    S = lengths["input_ids"]
    if S < 1:
        _fail("an episode needs at least one step")
    if len(set(lengths.values())) != 1:
        _fail(f"token lists must have one entry per step, got lengths {lengths}")
    if S > config.capacity_steps:
        _fail(f"{S} steps do not fit a ring of capacity_steps={config.capacity_steps}")

    step_index = np.asarray(episode["step_index"])
    if step_index.shape != (S,) or not np.array_equal(step_index, np.arange(S)):
        _fail(f"step_index must be 0..{S - 1} (contiguous, one transition per action), got {step_index.tolist()}")
    num_steps = np.asarray(episode["num_steps"])
    if num_steps.shape not in ((), (S,)) or not np.all(num_steps == S):
        _fail(f"num_steps must equal the number of steps {S} on every step, got {num_steps.tolist()}")

    vocab_limit = config.vocab_size or INT32_MAX + 1
    vocab_fix = (f"ids outside the vocabulary of {config.vocab_size} tokens come from a different tokenizer or a "
                 f"corrupted sequence" if config.vocab_size else "token ids are int32 vocabulary indices")
    tokens, lengths = [], []
    for j in range(S):
        ids, mask, logp, vers = (np.asarray(episode[k][j]) for k in TOKEN_KEYS)
        L = ids.shape[0] if ids.ndim == 1 else -1
        if L < 1 or any(a.shape != (L,) for a in (mask, logp, vers)):
            _fail(f"step {j}: input_ids, loss_mask, behave_logprobs, versions must be 1-D of one length, got "
                  f"{ids.shape}, {mask.shape}, {logp.shape}, {vers.shape}")
        if L > config.max_seq_len:
            _fail(f"step {j}: {L} tokens exceed max_seq_len={config.max_seq_len}; truncate the prompt or "
                  f"create the buffer with a larger max_seq_len")
        if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(vers.dtype, np.integer):
            _fail(f"step {j}: input_ids and versions must be integer arrays, got {ids.dtype}, {vers.dtype}")
        if not np.issubdtype(mask.dtype, np.integer) and not np.issubdtype(mask.dtype, np.bool_):
            _fail(f"step {j}: loss_mask must be an integer (0/1) array, got {mask.dtype}")
        _check_range(f"step {j}: input_ids", ids, 0, vocab_limit - 1, vocab_fix)
        _check_range(f"step {j}: versions", vers, -1, INT32_MAX,
                     "policy versions are int32 (-1 on prompt tokens), no larger version can be stored")
        _check_range(f"step {j}: loss_mask", mask, 0, 1, "1 on policy tokens, 0 elsewhere")
        tokens.append({"input_ids": ids.astype(np.int32, copy=False), "loss_mask": mask.astype(np.int8, copy=False),
                       "behave_logprobs": logp.astype(np.float32, copy=False),
                       "versions": vers.astype(np.int32, copy=False)})
        lengths.append(L)
    # value checks on all steps at once; a failure names the first offending step
    ends = np.cumsum(lengths)
    flat = {k: np.concatenate([t[k] for t in tokens]) for k in ("loss_mask", "behave_logprobs", "versions")}
    mask, logp, vers = flat["loss_mask"], flat["behave_logprobs"], flat["versions"]
    first_step = lambda bad: int(np.searchsorted(ends, int(np.argmax(bad)), side="right"))
    policy = mask == 1
    per_step_policy = np.add.reduceat(policy.astype(np.int64), ends - np.asarray(lengths))
    if (per_step_policy == 0).any():
        _fail(f"step {int(np.argmin(per_step_policy))}: no policy tokens (loss_mask is all 0); every step is one "
              f"action the policy produced")
    bad = policy & ~(np.isfinite(logp) & (logp <= LOGPROB_TOLERANCE))
    if bad.any():
        _fail(f"step {first_step(bad)}: behaviour log-probs on policy tokens must be finite and <= 0 (one per token)")
    bad = ~policy & (logp != 0)
    if bad.any():
        _fail(f"step {first_step(bad)}: behave_logprobs must be 0 on prompt tokens (loss_mask == 0)")
    bad = policy & (vers < 0)
    if bad.any():
        _fail(f"step {first_step(bad)}: every policy token needs its policy version (>= 0), found "
              f"{int(bad.sum())} without one")
    bad = ~policy & (vers != -1)
    if bad.any():
        _fail(f"step {first_step(bad)}: versions must be -1 on prompt tokens (loss_mask == 0)")
    min_version, max_version = int(vers[policy].min()), int(vers[policy].max())

    terminated = _per_step(episode, "terminated", S, bool, scalar_at_last=True)
    truncated = _per_step(episode, "truncated", S, bool, scalar_at_last=True)
    ended = terminated | truncated
    if ended[:-1].any():
        first = int(np.argmax(ended))
        _fail(f"step {first} is terminal (terminated/truncated) but {S - 1 - first} steps follow it; "
              f"nothing may come after the terminal step")
    reward = _per_step(episode, "reward", S, np.float32)
    if not np.isfinite(reward).all():
        _fail(f"reward must be finite, got {reward.tolist()}")
    group_ids = np.unique(np.asarray(episode["group_id"]))
    if group_ids.size != 1 or not np.issubdtype(group_ids.dtype, np.integer):
        _fail(f"group_id must be one integer for the whole episode, got {group_ids.tolist()}")
    _check_range("group_id", group_ids, -INT64_MAX - 1, INT64_MAX, "group ids are stored as int64")
    task_id = episode["task_id"]
    if not isinstance(task_id, str) or not task_id:
        _fail(f"task_id must be a non-empty str, got {task_id!r}")

    refs = np.asarray(episode["screenshot_refs"])
    if refs.ndim == 1 and refs.shape[0] == S:
        refs = refs[:, None]
    if refs.ndim != 2 or refs.shape[0] != S or not (refs.size == 0 or np.issubdtype(refs.dtype, np.integer)):
        _fail(f"screenshot_refs must be int64 [S={S}, K], got {refs.dtype} {refs.shape}")
    if refs.shape[1] > config.max_images_per_step:
        _fail(f"{refs.shape[1]} screenshots per step exceed max_images_per_step={config.max_images_per_step}")
    _check_range("screenshot_refs", refs, -1, INT64_MAX, "refs are >= 0, or -1 for padding")
    refs = refs.astype(np.int64)
    screenshots = episode.get("screenshots")
    if screenshots is not None:
        screenshots = np.asarray(screenshots)
        if screenshots.dtype != np.uint8 or screenshots.shape[1:] != config.screenshot_shape:
            _fail(f"screenshots must be uint8 [N, {', '.join(map(str, config.screenshot_shape))}], got "
                  f"{screenshots.dtype} {screenshots.shape}")
        if (refs >= len(screenshots)).any():
            _fail(f"screenshot_refs index past the {len(screenshots)} given screenshots")
        if len(screenshots) > config.capacity_screenshots:
            _fail(f"{len(screenshots)} screenshots do not fit capacity_screenshots={config.capacity_screenshots}")

    per_step = {"reward": reward, "terminated": terminated, "truncated": truncated,
                "env_failed": _per_step(episode, "env_failed", S, bool),
                "screenshot_changed": (_per_step(episode, "screenshot_changed", S, bool)
                                       if "screenshot_changed" in episode else np.ones(S, bool))}
    present = [k for k in MEMORY_KEYS if k in episode]
    for key, dtype in zip(MEMORY_KEYS, (np.int32, np.int32, np.float32)):
        per_step[key] = _per_step(episode, key, S, dtype) if key in present else np.zeros(S, dtype)
    info = episode.get("info") or {}
    try:
        if not isinstance(info, dict):
            raise TypeError(type(info).__name__)
        json.dumps(info)
    except (TypeError, ValueError) as e:
        _fail(f"'info' must be a JSON-serialisable dict (it is stored in the commit record), got: {e}")
    return CheckedEpisode(tokens=tokens, screenshot_refs=refs, screenshots=screenshots,
                          group_id=int(group_ids[0]), task_id=task_id, per_step=per_step,
                          memory_keys=present, info=info, min_version=min_version, max_version=max_version)


def to_rows(ep: CheckedEpisode, config: BufferConfig, first_seq: int, global_refs: np.ndarray) -> np.ndarray:
    """Step-row records of a checked episode: uint8 [S, row_itemsize], stamps first_seq..first_seq+S-1."""
    S = ep.num_steps
    rows = np.zeros(S, row_dtype(config))
    rows["stamp"] = first_seq + np.arange(S)
    rows["episode_id"] = first_seq
    rows["group_id"] = ep.group_id
    rows["step_index"] = np.arange(S)
    rows["num_steps"] = S
    p = ep.per_step
    rows["flags"] = (p["terminated"] * FLAG_TERMINATED | p["truncated"] * FLAG_TRUNCATED
                     | p["env_failed"] * FLAG_ENV_FAILED | p["screenshot_changed"] * FLAG_SCREENSHOT_CHANGED
                     | sum(FLAG_HAS_MEMORY[k] for k in ep.memory_keys))
    rows["reward"] = p["reward"]
    for key in ("memory_chars", "memory_keys", "memory_generic_frac"):
        rows[key] = p[key]
    rows["screenshot_refs"] = -1
    rows["screenshot_refs"][:, :global_refs.shape[1]] = global_refs
    for j, tok in enumerate(ep.tokens):
        L = len(tok["input_ids"])
        rows["seq_len"][j] = L
        for key in TOKEN_KEYS:
            rows[key][j, :L] = tok[key]
        rows["versions"][j, L:] = -1
    if config.checksums:
        rows["checksum"] = row_checksums(rows)
    return rows.view(np.uint8).reshape(S, rows.dtype.itemsize)


def from_rows(rows: np.ndarray, record: dict) -> dict:
    """Episode dict (docs/interfaces.md format, per-step fields as [S]) from structured rows [S]."""
    flags = rows["flags"]
    K = int(record["refs_width"])
    episode = {
        "episode_id": int(record["episode_id"]),
        "min_version": int(record["min_version"]),   # oldest policy-token version (computed once, on append)
        "task_id": record["task_id"],
        "group_id": int(record["group_id"]),
        "step_index": rows["step_index"].astype(np.int32),
        "num_steps": rows["num_steps"].astype(np.int32),
        "reward": rows["reward"].astype(np.float32),
        "terminated": (flags & FLAG_TERMINATED) > 0,
        "truncated": (flags & FLAG_TRUNCATED) > 0,
        "env_failed": (flags & FLAG_ENV_FAILED) > 0,
        "screenshot_changed": (flags & FLAG_SCREENSHOT_CHANGED) > 0,
        "screenshot_refs": np.ascontiguousarray(rows["screenshot_refs"][:, :K]),
        "info": record.get("info", {}),
    }
    for key in TOKEN_KEYS:
        episode[key] = [np.array(rows[key][j, :int(rows["seq_len"][j])]) for j in range(len(rows))]
    for key, bit in FLAG_HAS_MEMORY.items():
        if (flags & bit).any():
            episode[key] = np.array(rows[key])
    return episode
