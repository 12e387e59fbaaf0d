"""The typed episode: `Step` and `Episode`, built by the rollout worker, stored and read back by the buffer.

    step = Step(input_ids=ids, loss_mask=mask, behave_logprobs=logp, versions=vers, screenshot_refs=refs)
    episode = Episode(steps=(step, ...), task_id="miniwob/click-test", group_id=7, reward=1.0, terminated=True)
    episode.check_fits(buffer.config)     # the checks that depend on the buffer (RingBuffer.append runs them)

The Episode constructor checks every trajectory invariant that does not depend on the buffer and raises
EpisodeError (one line: what is wrong, and the fix); it stores the step arrays in their on-disk dtypes. One value
per episode is one field (reward, flags, task, group); one value per step lives on the Step. The buffer adds
`episode_id` on read (docs/interfaces.md, "Episodes").
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from jaxwebrl.buffer.schema import INT32_MAX, INT64_MAX, BufferConfig

LOGPROB_TOLERANCE = 1e-4  # behaviour log-probs may round a hair above 0
TOKEN_FIELDS = ("input_ids", "loss_mask", "behave_logprobs", "versions")
TOKEN_DTYPES = {"input_ids": np.int32, "loss_mask": np.int8, "behave_logprobs": np.float32, "versions": np.int32}


class EpisodeError(ValueError):
    """The episode breaks a trajectory invariant; nothing was written."""


def _fail(msg: str) -> None:
    raise EpisodeError(f"episode refused: {msg}")


def _check_range(what: str, values: np.ndarray, low: int, high: int, fix: str) -> None:
    """Refuses integers outside [low, high] before any cast could wrap them (2**40 must not become 0)."""
    if values.size and (int(values.min()) < low or int(values.max()) > high):
        bad = [v for v in values.reshape(-1).tolist() if not low <= v <= high]
        _fail(f"{what} must be in [{low}, {high}], got {bad[:4]}; {fix}")


def _same(a, b) -> bool:
    """Field equality where arrays compare by dtype, shape and values."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    return a == b


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Memory-bloat stats of the memory the agent holds after a step: characters, keys, share of generic keys."""

    chars: int
    keys: int
    generic_frac: float

    def __post_init__(self):
        for name in ("chars", "keys"):
            value = getattr(self, name)
            if not 0 <= int(value) <= INT32_MAX:
                _fail(f"memory {name} must be in [0, {INT32_MAX}], got {value}; it counts characters / keys")
            object.__setattr__(self, name, int(value))
        frac = float(np.float32(self.generic_frac))   # stored as float32: a read-back episode equals the written one
        if not 0.0 <= frac <= 1.0:
            _fail(f"memory generic_frac must be in [0, 1], got {self.generic_frac}; it is a share of the keys")
        object.__setattr__(self, "generic_frac", frac)


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One browser step: the tokens of one prompt + response and what the policy saw.

    input_ids [L] int32, loss_mask [L] int8 (1 on policy tokens), behave_logprobs [L] float32 (0 on prompt
    tokens), versions [L] int32 (policy version per policy token, -1 on prompt tokens), screenshot_refs [K] int64
    (-1 padded; global refs, or local indices into `Episode.screenshots` when it carries its pixels),
    screenshot_changed (step 0 counts as changed), memory (None when the agent keeps none).
    The values are checked by the Episode that holds the step (errors then name the step).
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    behave_logprobs: np.ndarray
    versions: np.ndarray
    screenshot_refs: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    screenshot_changed: bool = True
    memory: MemoryStats | None = None

    def __post_init__(self):
        for name in TOKEN_FIELDS + ("screenshot_refs",):
            object.__setattr__(self, name, np.asarray(getattr(self, name)))
        object.__setattr__(self, "screenshot_changed", bool(self.screenshot_changed))
        if self.memory is not None and not isinstance(self.memory, MemoryStats):
            _fail(f"Step.memory must be a MemoryStats or None, got {type(self.memory).__name__}")

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def __eq__(self, other) -> bool:
        return isinstance(other, Step) and all(_same(getattr(self, f.name), getattr(other, f.name))
                                               for f in dataclasses.fields(self))

    __hash__ = None


def _normalised_step(j: int, step: Step) -> Step:
    """`step` with shapes, dtypes and integer ranges checked and its arrays in their stored dtypes."""
    if not isinstance(step, Step):
        _fail(f"step {j} must be a jaxwebrl.buffer.episode.Step, got {type(step).__name__}")
    ids, mask, logp, vers = (getattr(step, k) for k in TOKEN_FIELDS)
    L = ids.shape[0] if ids.ndim == 1 else -1
    if L < 1 or any(a.shape != (L,) for a in (mask, logp, vers)):
        _fail(f"step {j}: input_ids, loss_mask, behave_logprobs, versions must be 1-D of one length, got "
              f"{ids.shape}, {mask.shape}, {logp.shape}, {vers.shape}")
    if not np.issubdtype(ids.dtype, np.integer) or not np.issubdtype(vers.dtype, np.integer):
        _fail(f"step {j}: input_ids and versions must be integer arrays, got {ids.dtype}, {vers.dtype}")
    if not np.issubdtype(mask.dtype, np.integer) and not np.issubdtype(mask.dtype, np.bool_):
        _fail(f"step {j}: loss_mask must be an integer (0/1) array, got {mask.dtype}")
    if not np.issubdtype(logp.dtype, np.floating):
        _fail(f"step {j}: behave_logprobs must be a float array, got {logp.dtype}")
    _check_range(f"step {j}: input_ids", ids, 0, INT32_MAX, "token ids are int32 vocabulary indices")
    _check_range(f"step {j}: versions", vers, -1, INT32_MAX,
                 "policy versions are int32 (-1 on prompt tokens), no larger version can be stored")
    _check_range(f"step {j}: loss_mask", mask.astype(np.int64), 0, 1, "1 on policy tokens, 0 elsewhere")
    refs = step.screenshot_refs
    if refs.ndim != 1 or not (refs.size == 0 or np.issubdtype(refs.dtype, np.integer)):
        _fail(f"step {j}: screenshot_refs must be int64 [K] (-1 padded), got {refs.dtype} {refs.shape}")
    _check_range(f"step {j}: screenshot_refs", refs, -1, INT64_MAX, "refs are >= 0, or -1 for padding")
    arrays = {k: getattr(step, k).astype(TOKEN_DTYPES[k], copy=False) for k in TOKEN_FIELDS}
    return dataclasses.replace(step, **arrays, screenshot_refs=refs.astype(np.int64, copy=False))


def _check_token_values(steps: tuple[Step, ...]) -> tuple[int, int]:
    """Log-prob and version rules on all steps at once (a failure names the first offending step); returns the
    (min, max) policy-token version."""
    lengths = np.array([s.num_tokens for s in steps])
    ends = np.cumsum(lengths)
    mask, logp, vers = (np.concatenate([getattr(s, k) for s in steps])
                        for k in ("loss_mask", "behave_logprobs", "versions"))
    first_step = lambda bad: int(np.searchsorted(ends, int(np.argmax(bad)), side="right"))
    policy = mask == 1
    per_step_policy = np.add.reduceat(policy.astype(np.int64), ends - lengths)
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
    return int(vers[policy].min()), int(vers[policy].max())


@dataclasses.dataclass(frozen=True, eq=False)
class Episode:
    """One whole episode: its steps and one value per episode.

    steps: S >= 1 Steps. task_id: the env's task (non-empty). group_id: int64, shared by the G episodes of one
    task instance. reward: the episode's reward (one per episode, finite; stored as float32, and rounded to it
    here so a read-back episode equals the written one). terminated / truncated: how the last step ended it
    (nothing follows a terminal step: there is no earlier one to mark). env_failed: the environment broke (the
    trainer excludes such episodes, never scores them). cut: a step outgrew the buffer's max_seq_len and the episode
    ended before it (the trainer excludes and counts it like env_failed; it is no failure of the agent). info: JSON-able metadata (kept in the commit record).
    screenshots: uint8 [N, H, W, 3] when the episode carries its own pixels (the steps' refs then index it), None
    when its refs are global (put during the episode). episode_id: set by the buffer on read (None before).
    Derived once: num_steps, min_version / max_version (oldest / newest policy-token version).
    """

    steps: tuple
    task_id: str
    group_id: int
    reward: float
    terminated: bool = False
    truncated: bool = False
    env_failed: bool = False
    cut: bool = False
    info: dict = dataclasses.field(default_factory=dict)
    screenshots: np.ndarray | None = None
    episode_id: int | None = None
    num_steps: int = dataclasses.field(init=False)
    min_version: int = dataclasses.field(init=False)
    max_version: int = dataclasses.field(init=False)

    def __post_init__(self):
        if isinstance(self.steps, (dict, str)) or not hasattr(self.steps, "__len__"):
            _fail(f"steps must be a sequence of Step, got {type(self.steps).__name__}")
        if len(self.steps) < 1:
            _fail("an episode needs at least one step")
        steps = tuple(_normalised_step(j, s) for j, s in enumerate(self.steps))
        widths = {s.screenshot_refs.shape[0] for s in steps}
        if len(widths) != 1:
            _fail(f"screenshot_refs of every step must have one width K (pad with -1), got widths {sorted(widths)}")
        min_version, max_version = _check_token_values(steps)
        if not isinstance(self.task_id, str) or not self.task_id:
            _fail(f"task_id must be a non-empty str, got {self.task_id!r}")
        if isinstance(self.group_id, (bool, np.bool_)) or not isinstance(self.group_id, (int, np.integer)):
            _fail(f"group_id must be one integer for the whole episode, got {self.group_id!r}")
        _check_range("group_id", np.array([int(self.group_id)], object), -INT64_MAX - 1, INT64_MAX,
                     "group ids are stored as int64")
        try:
            reward = float(np.float32(self.reward))
        except (TypeError, ValueError):
            reward = float("nan")
        if not np.isfinite(reward) or np.ndim(self.reward):
            _fail(f"reward must be one finite number per episode, got {self.reward!r}")
        for name in ("terminated", "truncated", "env_failed", "cut"):
            if np.ndim(getattr(self, name)):
                _fail(f"{name} must be one bool per episode (the last step's), got {getattr(self, name)!r}")
        try:
            if not isinstance(self.info, dict):
                raise TypeError(type(self.info).__name__)
            json.dumps(self.info)
        except (TypeError, ValueError) as e:
            _fail(f"'info' must be a JSON-serialisable dict (it is stored in the commit record), got: {e}")
        screenshots = self.screenshots
        if screenshots is not None:
            screenshots = np.asarray(screenshots)
            if screenshots.dtype != np.uint8 or screenshots.ndim != 4 or screenshots.shape[-1] != 3:
                _fail(f"screenshots must be uint8 [N, H, W, 3], got {screenshots.dtype} {screenshots.shape}")
            if any((s.screenshot_refs >= len(screenshots)).any() for s in steps):
                _fail(f"screenshot_refs index past the {len(screenshots)} given screenshots")
        if self.episode_id is not None and not isinstance(self.episode_id, (int, np.integer)):
            _fail(f"episode_id is set by the buffer (an int), got {self.episode_id!r}")
        values = dict(steps=steps, group_id=int(self.group_id), reward=reward, terminated=bool(self.terminated),
                      truncated=bool(self.truncated), env_failed=bool(self.env_failed), cut=bool(self.cut),
                      screenshots=screenshots,
                      episode_id=None if self.episode_id is None else int(self.episode_id),
                      num_steps=len(steps), min_version=min_version, max_version=max_version)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def screenshot_refs(self) -> np.ndarray:
        """[S, K] int64, the steps' refs stacked (-1 padded)."""
        return np.stack([s.screenshot_refs for s in self.steps])

    def memory_per_step(self) -> tuple[float, float, float] | None:
        """(chars, keys, generic_frac) of the memory the agent held after each step, averaged over the steps that
        recorded one; None when none did."""
        stats = [s.memory for s in self.steps if s.memory is not None]
        if not stats:
            return None
        return (float(np.mean([m.chars for m in stats])), float(np.mean([m.keys for m in stats])),
                float(np.mean([m.generic_frac for m in stats])))

    def check_fits(self, config: BufferConfig) -> None:
        """Raises EpisodeError when the episode does not fit a buffer of `config` (lengths, vocabulary, capacity,
        screenshot shape, images per step)."""
        if self.num_steps > config.capacity_steps:
            _fail(f"{self.num_steps} steps do not fit a ring of capacity_steps={config.capacity_steps}")
        for j, step in enumerate(self.steps):
            if step.num_tokens > config.max_seq_len:
                _fail(f"step {j}: {step.num_tokens} tokens exceed max_seq_len={config.max_seq_len}; truncate the "
                      f"prompt or create the buffer with a larger max_seq_len")
            if config.vocab_size:
                _check_range(f"step {j}: input_ids", step.input_ids, 0, config.vocab_size - 1,
                             f"ids outside the vocabulary of {config.vocab_size} tokens come from a different "
                             f"tokenizer or a corrupted sequence")
        K = self.steps[0].screenshot_refs.shape[0]
        if K > config.max_images_per_step:
            _fail(f"{K} screenshots per step exceed max_images_per_step={config.max_images_per_step}")
        if self.screenshots is not None:
            if self.screenshots.shape[1:] != config.screenshot_shape:
                _fail(f"screenshots must be uint8 [N, {', '.join(map(str, config.screenshot_shape))}], got "
                      f"{self.screenshots.dtype} {self.screenshots.shape}")
            if len(self.screenshots) > config.capacity_screenshots:
                _fail(f"{len(self.screenshots)} screenshots do not fit "
                      f"capacity_screenshots={config.capacity_screenshots}")

    def __eq__(self, other) -> bool:
        return isinstance(other, Episode) and all(_same(getattr(self, f.name), getattr(other, f.name))
                                                  for f in dataclasses.fields(self))

    __hash__ = None
