"""Continuous batching over a fixed set of decode slots, on the `Sampler`'s prefill and decode step.

    batcher = ContinuousBatcher(sampler, SamplingParams(max_new_tokens=64, stop_token_ids=(eos,)), slots=8)
    batcher.admit(weights, prompts, seeds=[3, 4], tags=["a", "b"])   # prefilled into two free slots
    while batcher.occupied:
        for tag, sequence in batcher.decode_chunk(weights):          # rows that stopped, answered at once
            ...
        batcher.admit(weights, more_prompts, seeds, tags)            # new rows join the ones still decoding

The static path (`Sampler.generate`) decodes a batch to its last row's end: a request that arrives just after it
starts waits a whole generation, and finished rows keep their slots. Here every row has its own step (`DecodeState.
step` is [B]): at each chunk boundary the rows that stopped (stop token, stop string or max_new_tokens) leave, and
queued prompts are prefilled into the free slots (`admit`: a fresh prefill of just those rows, with their own
positions, rope index, images and constraint state, then scattered into the slot state at their slots; slots past
their prompt are marked invalid) and decode on beside the others. A row's tokens, fp32 behaviour log-probs and
per-token versions are those the static path gives it decoded alone: rows never attend each other, each row draws
from its own key (`seeds`, as `Sampler.generate(seed=[...])`), and its chunk boundaries are the batcher's, each
`decode_chunk` steps after its admission, where the weights are re-read (a swap lands there, recorded per token).

Shapes are static: `slots` rows, a cache of `capacity` slots a row, N = max_new_tokens. Compiled programs: one
decode chunk per capacity, and one admission per (admitted rows: a multiple of the sampler's `batch_multiple`,
prompt width: `bucket(L, prompt_multiple)`, image-grid bucket, capacity). The capacity is the widest admitted
prompt's width + N, grown (cache padded, never shrunk) when a wider prompt arrives; pass `capacity` to fix it
from the start. After warm-up an admission recompiles nothing: slot indices, seeds, weights and versions are all
traced arguments. Every row then has the capacity of the widest prompt: a dense read (the sampler's decode_block
0) reads all of it for every row, a ragged one (decode_block > 0) only up to the furthest filled slot. Whether continuous batching pays on an accelerator is measured, not assumed
(`bench/continuous_batching.py` on the CPU, `bench/device_check.py decode` variant `continuous`), so the policy
server's `rollout.continuous_batching` is off by default.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.models import kv_cache
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.sampler import DecodeState, SampledSequence, Sampler, SamplingParams, row_keys, sequence_of


class ContinuousBatcher:
    """Fixed decode slots that rows join and leave at chunk boundaries (see the module docstring).

    Args:
      sampler: a one-device `Sampler` (its module, constraint, decode_chunk, prompt_multiple and decode_block).
      sampling: the sampling of every row (one compiled setting; a server keeps one batcher a setting).
      constraint: the automaton every row decodes under (None: the sampler's own; a judge's verdict grammar).
      slots: rows decoded together (the policy server's max_batch).
      capacity: cache slots a row (None: grown to the widest admitted prompt + max_new_tokens).
      decode_text: tokens -> text, needed only for `sampling.stop_strings`.
    """

    def __init__(self, sampler: Sampler, sampling: SamplingParams, slots: int, *, capacity: int | None = None,
                 decode_text: Callable[[np.ndarray], str] | None = None, constraint: TokenConstraint | None = None):
        if sampler.mesh is not None:
            raise ValueError("continuous batching runs the sampler on one device (as the policy server does): "
                             "build the Sampler with mesh=None")
        if slots < 1:
            raise ValueError(f"continuous batching needs slots >= 1, got {slots}")
        if sampling.stop_strings and decode_text is None:
            raise ValueError("sampling.stop_strings needs decode_text (e.g. processor.tokenizer.decode)")
        self.sampler, self.sampling, self.slots = sampler, sampling, int(slots)
        self.decode_text = decode_text
        self._static = dataclasses.replace(sampling, stop_token_ids=(), stop_strings=())   # stop ids are traced
        self._stop_ids = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)
        constraint = sampler.constraint if constraint is None else constraint
        self._prefix, self._prefix_state = sampler._forced_prefix(sampling, constraint)
        self._tables = sampler._tables_of(constraint)   # on the device
        self._occupants: list[tuple[Hashable, np.ndarray] | None] = [None] * self.slots   # (tag, prompt ids)
        self._stopped: dict[int, int] = {}   # slot -> tokens kept, for rows a stop string ended
        self._state: DecodeState | None = None
        self.capacity = 0 if capacity is None else int(capacity)
        self._fixed_capacity = capacity is not None
        self.trace_counts = {"admit": 0, "decode": 0}   # incremented at trace time: recompilation counter
        self._admit = jax.jit(self._admit_fn, static_argnames=("grid", "sampling"), donate_argnames=("state",))
        self._decode = jax.jit(self._decode_fn, static_argnames=("sampling",), donate_argnames=("state",))

    @property
    def occupied(self) -> int:
        """Rows being decoded (admitted, not yet returned by `decode_chunk`)."""
        return sum(o is not None for o in self._occupants)

    @property
    def tags(self) -> list[Hashable | None]:
        """The tag of the row in each slot (None: free)."""
        return [None if occupant is None else occupant[0] for occupant in self._occupants]

    @property
    def free_slots(self) -> int:
        return self.slots - self.occupied

    def release(self) -> None:
        """Drops the cache of an idle batcher (its compiled programs stay; the next admission allocates anew)."""
        if self.occupied:
            raise RuntimeError(f"release: {self.occupied} rows are still decoding; release an idle batcher only")
        self._state = None

    # ------------------------------------------------------------------ jitted pieces
    def _admit_fn(self, params, state: DecodeState, input_ids, attention_mask, pixel_values, rng, slots, version,
                  stop_ids, tables, prefix, prefix_state, *, grid, sampling: SamplingParams) -> DecodeState:
        """Prefills input_ids [A, W] alone (a fresh cache of W slots) and writes its rows into `state` at slots [A]
        int32 (the slot count: a filler row, dropped)."""
        self.trace_counts["admit"] += 1
        rows, width = input_ids.shape
        fresh = kv_cache.init_cache(self.sampler.config, rows, width, jnp.dtype(self.sampler.config.dtype),
                                    decode_block=self.sampler.decode_block)
        new = self.sampler.prefill_state(params, input_ids, attention_mask, pixel_values, fresh, rng, version,
                                         stop_ids, tables, prefix, prefix_state, grid=grid, sampling=sampling)

        def put(buffer, rows_value):
            return buffer.at[slots].set(rows_value.astype(buffer.dtype), mode="drop")

        old, capacity = state.cache, state.cache["valid"].shape[1]
        cache = {
            "layers": [{name: layer[name].at[slots, :, :width].set(new_layer[name].astype(layer[name].dtype),
                                                                  mode="drop") for name in ("k", "v")}
                       for layer, new_layer in zip(old["layers"], new.cache["layers"])],
            "index": put(old["index"], new.cache["index"]),
            "valid": put(old["valid"], jnp.pad(new.cache["valid"], ((0, 0), (0, capacity - width)))),
            "next_position": put(old["next_position"], new.cache["next_position"]),
            "read": old["read"],
        }
        return DecodeState(cache=cache, tokens=put(state.tokens, new.tokens), logprobs=put(state.logprobs, new.logprobs),
                           versions=put(state.versions, new.versions), done=put(state.done, new.done),
                           lengths=put(state.lengths, new.lengths),
                           step=put(state.step, jnp.broadcast_to(new.step, (rows,))),
                           constraint_state=put(state.constraint_state, new.constraint_state),
                           rng=put(state.rng, new.rng))

    def _decode_fn(self, params, state: DecodeState, version, stop_ids, tables, *, sampling: SamplingParams):
        """`decode_chunk` decode steps of every slot, or fewer when every slot is done."""
        self.trace_counts["decode"] += 1

        def keep_going(carry):
            steps, s = carry
            return (steps < self.sampler.decode_chunk) & ~jnp.all(s.done)

        def one_step(carry):
            steps, s = carry
            return steps + 1, self.sampler.decode_step(params, s, version, stop_ids, tables, sampling)

        return jax.lax.while_loop(keep_going, one_step, (jnp.int32(0), state))[1]

    # ------------------------------------------------------------------ host side
    def _empty_state(self, capacity: int) -> DecodeState:
        """Every slot free (done), with a cache of `capacity` slots a row."""
        n, b = self.sampling.max_new_tokens, self.slots
        cache = kv_cache.init_cache(self.sampler.config, b, capacity, jnp.dtype(self.sampler.config.dtype),
                                    decode_block=self.sampler.decode_block)
        return DecodeState(cache=cache, tokens=jnp.full((b, n), self.sampler.pad_token_id, jnp.int32),
                           logprobs=jnp.zeros((b, n), jnp.float32), versions=jnp.full((b, n), -1, jnp.int32),
                           done=jnp.ones((b,), bool), lengths=jnp.zeros((b,), jnp.int32),
                           step=jnp.zeros((b,), jnp.int32), constraint_state=jnp.zeros((b,), jnp.int32),
                           rng=row_keys(0, b, b))

    def _ensure_capacity(self, width: int) -> None:
        needed = width + self.sampling.max_new_tokens
        if self._state is not None and needed <= self.capacity:
            return
        if self._fixed_capacity and needed > self.capacity:
            raise ValueError(f"a prompt {width} tokens wide (bucketed) needs {needed} cache slots with "
                             f"max_new_tokens={self.sampling.max_new_tokens}, beyond capacity={self.capacity}: "
                             "raise capacity or pass None to grow it")
        self.capacity = max(self.capacity, needed)
        if self._state is None:
            self._state = self._empty_state(self.capacity)
            return
        cache = self._state.cache
        grow = self.capacity - cache["valid"].shape[1]   # new slots are empty (invalid): no row reads them
        layers = [{name: jnp.pad(layer[name], ((0, 0), (0, 0), (0, grow), (0, 0))) for name in ("k", "v")}
                  for layer in cache["layers"]]
        self._state = self._state._replace(cache=dict(cache, layers=layers,
                                                      valid=jnp.pad(cache["valid"], ((0, 0), (0, grow)))))

    def admit(self, weights: tuple[Any, int] | Callable[[], tuple[Any, int]], prompts: Sequence[dict],
              seeds: Sequence[int], tags: Sequence[Hashable]) -> None:
        """Prefills `prompts` (processor outputs, as `Sampler.generate` takes) into free slots; each row draws from
        the key of its seed (int in [0, 2**32)) and is returned by `decode_chunk` with its tag."""
        if not prompts:
            return
        if not len(prompts) == len(seeds) == len(tags):
            raise ValueError(f"admit: {len(prompts)} prompts, {len(seeds)} seeds and {len(tags)} tags; pass one of "
                             "each a request")
        free = [slot for slot, occupant in enumerate(self._occupants) if occupant is None]
        if len(prompts) > len(free):
            raise ValueError(f"admit: {len(prompts)} prompts for {len(free)} free slots; admit at most free_slots")
        ids, mask, pixels, grid = self.sampler._batch(prompts, self._prefix)
        rows, width = ids.shape
        self._ensure_capacity(width)
        slots = np.asarray(free[:len(prompts)] + [self.slots] * (rows - len(prompts)), np.int32)
        params, version = self.sampler._weights(weights)
        self._state = self._admit(params, self._state, jnp.asarray(ids), jnp.asarray(mask),
                                  None if pixels is None else jnp.asarray(pixels), row_keys(list(seeds), len(prompts),
                                                                                           rows),
                                  jnp.asarray(slots), jnp.int32(version), self._stop_ids, self._tables,
                                  jnp.asarray(self._prefix), jnp.int32(self._prefix_state), grid=grid,
                                  sampling=self._static)
        for slot, prompt, tag in zip(slots, prompts, tags):
            self._occupants[int(slot)] = (tag, np.asarray(prompt["input_ids"], np.int32))

    def decode_chunk(self, weights: tuple[Any, int] | Callable[[], tuple[Any, int]]
                     ) -> list[tuple[Hashable, SampledSequence]]:
        """Decodes one chunk (weights read once, before it) and returns (tag, sequence) of every row that has
        stopped, freeing its slot; rows that stopped at admission are returned too."""
        if self._state is None or not self.occupied:
            return []
        params, version = self.sampler._weights(weights)
        self._state = self._decode(params, self._state, jnp.int32(version), self._stop_ids, self._tables,
                                   sampling=self._static)
        done = np.asarray(jax.device_get(self._state.done))
        occupied = [slot for slot, occupant in enumerate(self._occupants) if occupant is not None]
        if self.sampling.stop_strings:
            self._state, done = self.sampler.apply_stop_strings(
                self._state, done, occupied, self.sampling, self.decode_text, self._stopped)
        finished = [slot for slot in occupied if done[slot]]
        if not finished:
            return []
        arrays = jax.device_get((self._state.tokens, self._state.logprobs, self._state.versions,
                                 self._state.lengths))
        answered = []
        for slot in finished:
            tag, prompt_ids = self._occupants[slot]
            answered.append((tag, sequence_of(arrays, slot, prompt_ids, self.sampling, self._stopped.pop(slot, None))))
            self._occupants[slot] = None
        return answered
