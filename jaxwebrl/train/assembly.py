"""Episodes from the ring buffer -> one `UpdateBatch` of padded step rows with their images.

The Episodes' steps become padded rows once, here (`batching.pad_steps`, straight from `Episode.steps`); screenshots
are fetched by reference once per distinct screenshot record and run through the policy's image processor, so the
trainer sees exactly the pixels the policy server saw. They stay distinct: with a prompt window, consecutive steps
show the same screenshots, and each row points at its images (`image_index`) instead of carrying copies. Row count and length are rounded up to a few buckets so the jitted
update compiles a handful of shapes, not one per batch. Episode and group ids of any width are ranked densely
here (int32 ranks, so a 64-bit id never wraps when it enters jnp).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from jaxwebrl.buffer import batching
from jaxwebrl.buffer.episode import Episode
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.parallel.buckets import bucket
from jaxwebrl.rl.segments import host_dense_ids

log = logging.getLogger(__name__)


class UpdateBatch(NamedTuple):
    """Step rows of one train step, host arrays. B rows (real rows first), T tokens.

    input_ids [B, T] int32; attention_mask [B, T] int32 (1 = real token); loss_mask [B, T] int32 (1 on policy
    tokens); behave_logprobs [B, T] float32; rewards [R] float32 raw episode reward; episode_ids, group_ids [R]
    int32 dense ranks of the rows' episode / group ids (R = num_real_rows); num_real_rows: rows before the padding
    rows (padding has loss_mask 0); pixel_values [P, D] float32 (the patches of each distinct screenshot once),
    image_grid_thw [U, 3] int64 (their grids) and image_index [B, K] int32 (row b's k-th image is distinct image
    image_index[b, k], -1: none), all None when no row has images. When the policy decoded under an action constraint: constraint_states [B, T]
    int32, the automaton state each policy token was drawn in (-1 elsewhere, and in rows whose response is
    outside the grammar; log-probs are recomputed under the allowed set of that state), and decision_mask
    [B, T] int32, the policy tokens that carry loss (the grammar left a choice; every policy token of a row
    outside it); both None otherwise. A minibatch compiles once per (rows, T, image grid) shape.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    loss_mask: np.ndarray
    behave_logprobs: np.ndarray
    rewards: np.ndarray
    episode_ids: np.ndarray
    group_ids: np.ndarray
    num_real_rows: int
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None
    image_index: np.ndarray | None = None
    constraint_states: np.ndarray | None = None
    decision_mask: np.ndarray | None = None

    @property
    def objective_mask(self) -> np.ndarray:
        """[B, T] int32: the tokens the loss is taken over (decision_mask when set, else loss_mask)."""
        return self.loss_mask if self.decision_mask is None else self.decision_mask


def rows_bucket(num_rows: int) -> int:
    """The smallest of 1, 2, 3, ..., 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (m·2^k, m in 4..7) that holds
    `num_rows`: at most 4 shapes per octave, and padding rows stay under 20% of the bucket. At the paper's scale a
    padding row costs a whole 16k-token forward and backward, so a power-of-two bucket (up to 50% padding) would
    waste more than the few extra compilations cost."""
    return bucket(num_rows)


def row_bucket(num_rows: int, n_minibatches: int, multiple: int = 1) -> int:
    """Rows of the padded batch: n_minibatches × rows_bucket(⌈num_rows / n_minibatches⌉), so every minibatch has
    the same static row count with room for a balanced split; with `multiple` (a trainer mesh's data × fsdp, see
    `parallel.mesh.constrain_batch`) that count is a multiple of it, so its rows split over the batch axes instead
    of running whole on every chip."""
    return n_minibatches * bucket(-(-max(int(num_rows), 1) // n_minibatches), multiple)   # rows_bucket at 1


LENGTH_MULTIPLE = 16   # row lengths pad to a multiple of this (a few programs, aligned tiles)


def length_bucket(longest: int, max_seq_len: int) -> int:
    """Tokens T of the padded batch: `bucket(longest, LENGTH_MULTIPLE)`, at most `max_seq_len` (a longer row is
    refused by `pad_steps`). Quarter octaves like the row count: the tiny default's rows of 234-378 tokens pad to
    384, not 512, and its update (attention quadratic in T) ran 1.7x faster for it (docs/live_loop.md)."""
    return min(bucket(longest, LENGTH_MULTIPLE), int(max_seq_len))


def balanced_minibatches(policy_tokens: np.ndarray, n_minibatches: int) -> np.ndarray:
    """Rows split into `n_minibatches` of equal row count, balanced by policy tokens (the loss denominators).

    Greedy longest-first partition (the sorted greedy AReaL's minibatch allocation uses, keyed here on policy
    tokens under a static row cap): rows in decreasing token count each go to the minibatch with the fewest
    tokens so far among those with a free row (ties: fewer rows, then lower index). Every minibatch gets a row
    with policy tokens whenever at least `n_minibatches` rows have them; rows without any (padding) fill the
    free slots.

    Args:
      policy_tokens: [B] int, tokens that carry loss in each row (0 for padding rows); B divisible by n_minibatches.
      n_minibatches: number of minibatches.

    Returns:
      [n_minibatches, B // n_minibatches] int64 row indices, a permutation of range(B), ascending within each.
    """
    tokens = np.asarray(policy_tokens, np.int64).reshape(-1)
    rows = tokens.shape[0]
    if n_minibatches < 1 or rows % n_minibatches:
        raise ValueError(f"{rows} rows do not split into {n_minibatches} minibatches of equal size; "
                         "pad the batch with assembly.row_bucket")
    cap = rows // n_minibatches
    load = np.zeros(n_minibatches, np.int64)
    count = np.zeros(n_minibatches, np.int64)
    members: list[list[int]] = [[] for _ in range(n_minibatches)]
    for row in np.argsort(-tokens, kind="stable"):
        # lexicographic (load, count, index) among minibatches with a free row
        key = np.where(count < cap, load * (cap + 1) + count, np.iinfo(np.int64).max)
        target = int(np.argmin(key))
        members[target].append(int(row))
        load[target] += tokens[row]
        count[target] += 1
    return np.stack([np.sort(np.asarray(m, np.int64)) for m in members])


def assemble(episodes: list[Episode], *, screenshots, image_processor, n_minibatches: int, max_seq_len: int,
             pad_id: int = 0, constraint: TokenConstraint | None = None, row_multiple: int = 1) -> UpdateBatch:
    """The UpdateBatch of `episodes` (read from the buffer): one row per step, episodes in order, steps in order.
    `constraint`: the action automaton the policy decoded under, if any (sets `decision_mask`). `row_multiple`:
    each minibatch's rows pad to a multiple of it (the trainer mesh's data × fsdp; `row_bucket`)."""
    if not episodes:
        raise ValueError("assemble needs at least one episode")
    n_rows = sum(ep.num_steps for ep in episodes)
    seq_len = length_bucket(max(step.num_tokens for ep in episodes for step in ep.steps), max_seq_len)
    B = row_bucket(n_rows, n_minibatches, row_multiple)
    padded = batching.pad_steps(episodes, seq_len=seq_len, batch_size=B, pad_id=pad_id)
    attention = padded["attention_mask"].astype(np.int32)
    attention[n_rows:, 0] = 1  # padding rows attend to one token: finite logits, no NaN through the mask

    pixel_values = grid = image_index = None
    refs = padded["screenshot_refs"]
    if (refs >= 0).any():
        images, image_index = batching.gather_screenshots(screenshots, refs)   # distinct records, [B, K] index
        processed = [image_processor([image]) for image in images]   # per distinct image: (pixels, grid)
        pixel_values = np.concatenate([pixels for pixels, _ in processed], axis=0).astype(np.float32)
        grid = np.concatenate([np.asarray(g).reshape(-1, 3) for _, g in processed], axis=0).astype(np.int64)
        image_index = image_index.astype(np.int32)
    loss_mask = padded["loss_mask"].astype(np.int32)
    states = decisions = None
    if constraint is not None:
        states, admitted = constraint.replay(padded["input_ids"], loss_mask)
        decisions = constraint.decision_mask(states, loss_mask, admitted)
        outside = int((~admitted[:n_rows]).sum())
        if outside:
            log.warning("%d of %d step rows hold responses outside the action grammar (not decoded under it); "
                        "they are trained on the unrestricted softmax", outside, n_rows)
    batch = UpdateBatch(
        input_ids=padded["input_ids"].astype(np.int32),
        attention_mask=attention,
        loss_mask=loss_mask,
        behave_logprobs=padded["behave_logprobs"].astype(np.float32),
        rewards=padded["reward"][:n_rows].astype(np.float32),
        episode_ids=host_dense_ids(padded["episode_id"][:n_rows]),
        group_ids=host_dense_ids(padded["group_id"][:n_rows]),
        num_real_rows=n_rows,
        pixel_values=pixel_values, image_grid_thw=grid, image_index=image_index,
        constraint_states=states, decision_mask=decisions)
    return batch
