"""KV-cache sampler: jitted prefill + chunked decode, per-token fp32 log-probs and policy versions.

    sampler = Sampler(policy.module, policy.config, pad_token_id=tokenizer.pad_token_id, decode_chunk=8)
    results = sampler.generate(weights, prompts, SamplingParams(max_new_tokens=64, stop_token_ids=(eos,)), seed=0)

`prompts` are processor outputs (dict(input_ids [L] int32, pixel_values [P, patch_dim] f32, image_grid_thw
[n, 3])); they are left-padded into one batch (padding never attended: the cache marks it invalid, and the
rope index skips it, so a padded row decodes exactly as it would alone). `weights` is `(params, version)` or a
callable returning it; it is read before the prefill and before every decode chunk, so the trainer can publish
new weights mid-generation: params are jit arguments (never constants), so a swap recompiles nothing, and
every generated token records the version that produced it.

Log-probabilities. `logprobs` is the log-prob of each token under the distribution it was actually drawn
from: the model's logits restricted to the tokens the constraint allows (all tokens without one), divided by
the temperature, truncated by top-k then top-p and renormalised, fp32 (`sampling_logits`). The trainer replays
exactly that transformation by teacher forcing (`jaxwebrl.train.update.token_logprobs`), so ratio =
exp(recomputed − logprobs) is one for unchanged weights whatever the sampling settings, and a token the grammar
forced has log-prob 0: it carries no gradient. Greedy decoding (temperature 0, evaluation only) draws from no
distribution; its `logprobs` are the model's own (constraint applied, temperature 1) for inspection.

Constrained decoding: a `TokenConstraint` (jaxwebrl/models/constraints.py) is a token-level automaton
(`allowed [S, V]`, `next_state [S, V]`, on the device in its compact form over K token columns): at each step a row
may only sample tokens its state allows. It is built from a vocabulary mask, a finite set of token sequences, or a
regex over the text (well-formed actions).
The tokens every response must start with (`forced_prefix`: states admitting one token, e.g. the 25 tokens of
`Memory: {}\nAction: click(` of the tiny action grammar) are prefilled with the prompt instead of decoded one
at a time, and recorded exactly as decoding would: log-prob 0, the prefill's version.

`generate` decodes one static batch to its last row's end; `models/continuous_batching.py` runs the same prefill
body (`prefill_state`) and decode step (`decode_step`) over fixed slots that rows join and leave between chunks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.models import kv_cache, vision_layout
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.sampling_transform import NEG_INF as _NEG_INF, sampling_logits, truncates  # noqa: F401
from jaxwebrl.models import stacking
from jaxwebrl.parallel import partition
from jaxwebrl.parallel.buckets import bucket
from jaxwebrl.parallel.mesh import batch_divisor

# A constraint's device tables have at least this many token columns (a power of two): the verdict grammars of
# every fact count (~160 distinct tokens over Qwen's vocabulary) share one table shape, so one compiled decode.
MIN_TABLE_COLUMNS = 256


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature=0` is greedy; `top_k=0` and `top_p=1` disable truncation.

    Generation of a row stops at a token of `stop_token_ids` (which is kept, as a policy token), at a
    `stop_strings` match (tokens after the one completing it are dropped; checked between decode chunks), or
    after `max_new_tokens`. Each distinct (max_new_tokens, temperature, top_k, top_p) compiles once; stop
    tokens and strings do not cause recompilation.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))


@dataclasses.dataclass
class SampledSequence:
    """One row's generation. Arrays are `[n]` over the generated tokens (n ≤ max_new_tokens)."""

    prompt_ids: np.ndarray  # [L] int32, unpadded
    tokens: np.ndarray  # [n] int32
    logprobs: np.ndarray  # [n] float32, under the distribution each token was drawn from (`sampling_logits`)
    versions: np.ndarray  # [n] int32, policy version that produced each token
    finish_reason: str  # "stop_token", "stop_string" or "length"


class DecodeState(NamedTuple):
    """Everything a decode chunk carries (a pytree; B rows, N = max_new_tokens)."""

    cache: dict
    tokens: jax.Array  # [B, N] int32
    logprobs: jax.Array  # [B, N] float32
    versions: jax.Array  # [B, N] int32 (-1 where nothing was generated)
    done: jax.Array  # [B] bool
    lengths: jax.Array  # [B] int32: tokens generated (stop token included)
    step: jax.Array  # () int32: index of the next token to generate; [B] when rows started apart (slots of
    #                  `models/continuous_batching.py`)
    constraint_state: jax.Array  # [B] int32
    rng: jax.Array  # [B, 2] uint32: each row's own key (a row's draws never depend on the rows beside it)


def sample_logits(logits: jax.Array, rng: jax.Array, sampling: SamplingParams, allowed: jax.Array | None = None):
    """Draws one token per row. logits `[B, V] float32`; rng `[B, 2]` uint32, one key a row; allowed `[B, V]`
    bool or None.

    Returns (token [B] int32, logprob [B] f32): the log-prob under the distribution the token was drawn from
    (`sampling_logits`); for greedy decoding, under the model's own softmax restricted to `allowed`.
    """
    if sampling.temperature == 0:
        processed = logits.astype(jnp.float32)
        if allowed is not None:
            processed = jnp.where(allowed, processed, _NEG_INF)
        token = jnp.argmax(processed, axis=-1).astype(jnp.int32)
    else:
        processed = sampling_logits(logits, allowed, temperature=sampling.temperature, top_k=sampling.top_k,
                                    top_p=sampling.top_p)
        token = jax.vmap(jax.random.categorical)(rng, processed).astype(jnp.int32)
    logprob = jnp.take_along_axis(jax.nn.log_softmax(processed, axis=-1), token[:, None], axis=-1)[:, 0]
    return token, logprob


class Sampler:
    """Batched generation with a KV cache for a `VisionLanguageModel` (see the module docstring).

    Args:
      module, config: the policy's flax module and ModelConfig.
      pad_token_id: id used for left padding (never attended) and after a row finishes.
      decode_chunk: decode steps per jitted chunk; weights are re-read between chunks.
      prompt_multiple: padded prompt lengths are `bucket(length, prompt_multiple)` (bounds recompilation).
      batch_multiple: batch is padded with empty rows to a multiple of this (and of the mesh's batch divisor).
      constraint: optional TokenConstraint applied to every row.
      prefill_forced: prefill the constraint's forced prefix with the prompt (same tokens and log-probs as
        decoding it, fewer sequential steps); False decodes it token by token.
      mesh: optional Mesh; params, cache and batch are then sharded by `jaxwebrl.parallel.partition`.
      decode_block: 0: a decode step reads every cache slot in one pass; > 0: the key blocks of that many slots up
        to the furthest filled one (`kv_cache.DecodeRead`, `models/decode_attention.py`).

    The weights are decoded in the dtype they arrive in: a server passes a bf16 copy of fp32 master weights
    (`models/serving_weights.py`); the logits and log-probs are fp32 whatever the weights' dtype.
    """

    def __init__(self, module, config, *, pad_token_id: int = 0, decode_chunk: int = 8, prompt_multiple: int = 16,
                 batch_multiple: int = 1, constraint: TokenConstraint | None = None, prefill_forced: bool = True,
                 mesh=None, decode_block: int = 0):
        if decode_chunk < 1:
            raise ValueError(f"decode_chunk must be >= 1, got {decode_chunk}")
        self._stacked_config = config if config.scan_layers else None
        if config.scan_layers:  # the KV-cache path runs the unrolled twin on unstacked weights
            from jaxwebrl.models.vl_model import VisionLanguageModel

            config = config.replace(scan_layers=False)
            module = VisionLanguageModel(config)
        self._resolved: tuple[Any, Any] | None = None    # (params seen last, as decoded: unstacked, committed)
        self.module, self.config = module, config
        self.pad_token_id = int(pad_token_id)
        self.decode_chunk = int(decode_chunk)
        self.prompt_multiple = int(prompt_multiple)
        self.batch_multiple = int(batch_multiple) * (1 if mesh is None else batch_divisor(mesh))
        self.mesh = mesh
        self.decode_block = kv_cache.DecodeRead(int(decode_block)).block   # a bad value fails here
        self.constraint = constraint
        self.prefill_forced = bool(prefill_forced)
        self._prefixes: dict[tuple, tuple[np.ndarray, int]] = {}   # (constraint, stop ids, max_new_tokens) -> prefix
        self._tables: dict[int, tuple] = {}   # id(constraint) -> (constraint, its device tables)
        self._tables_of(constraint)   # a constraint of the wrong vocabulary fails here
        self._param_shardings = None
        self.trace_counts = {"prefill": 0, "decode": 0}  # incremented at trace time: recompilation counter
        self._prefill = jax.jit(self._prefill_fn, static_argnames=("grid", "sampling"), donate_argnames=("cache",))
        self._decode = jax.jit(self._decode_fn, static_argnames=("sampling",), donate_argnames=("state",))

    # ------------------------------------------------------------------ jitted pieces
    def _allowed(self, tables, constraint_state):
        """[B, V] bool: the tokens each row's constraint state allows (a row of the compact table, per column)."""
        return None if tables is None else jnp.take(tables[0][constraint_state], tables[2], axis=1)

    def _advance(self, state: DecodeState, logits, version, stop_ids, tables, sampling: SamplingParams) -> DecodeState:
        """Samples the token at `state.step` for every unfinished row and records it."""
        keys = jax.vmap(jax.random.split)(state.rng)   # [B, 2, 2]
        rng, key = keys[:, 0], keys[:, 1]
        token, logprob = sample_logits(logits, key, sampling, self._allowed(tables, state.constraint_state))
        live = ~state.done
        token = jnp.where(live, token, self.pad_token_id)
        step = state.step

        def put(buffer, value):
            if step.ndim == 0:
                return jax.lax.dynamic_update_slice(buffer, value[:, None].astype(buffer.dtype), (0, step))
            at_step = jnp.arange(buffer.shape[1], dtype=jnp.int32)[None, :] == step[:, None]
            return jnp.where(at_step, value[:, None].astype(buffer.dtype), buffer)

        stop = jnp.isin(token, stop_ids)
        done = state.done | (live & stop) | (step + 1 >= sampling.max_new_tokens)
        next_state = state.constraint_state
        if tables is not None:
            next_state = jnp.where(live, tables[1][state.constraint_state, tables[2][token]], state.constraint_state)
        return DecodeState(
            cache=state.cache,
            tokens=put(state.tokens, token),
            logprobs=put(state.logprobs, jnp.where(live, logprob, 0.0)),
            versions=put(state.versions, jnp.where(live, version, -1)),
            done=done,
            lengths=jnp.where(live, step + 1, state.lengths),
            step=step + 1,
            constraint_state=next_state,
            rng=rng,
        )

    def _prefill_fn(self, params, input_ids, attention_mask, pixel_values, cache, rng, version, stop_ids, tables,
                    prefix, prefix_state, *, grid, sampling: SamplingParams) -> DecodeState:
        self.trace_counts["prefill"] += 1
        return self.prefill_state(params, input_ids, attention_mask, pixel_values, cache, rng, version, stop_ids,
                                  tables, prefix, prefix_state, grid=grid, sampling=sampling)

    def prefill_state(self, params, input_ids, attention_mask, pixel_values, cache, rng, version, stop_ids, tables,
                      prefix, prefix_state, *, grid, sampling: SamplingParams) -> DecodeState:
        """Prompt (ending with the forced `prefix` [P], already in `input_ids`) -> cache and the first sample
        (traceable: the body of the jitted prefill, and of a continuous batcher's admission)."""
        logits, cache = self.module.apply(   # head="last": logits of the last position only, [B, 1, V]
            {"params": params}, input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
            image_grid_thw=None if grid is None else np.asarray(grid), cache=cache, head="last",
            fresh_cache=True)   # generate's cache is new: the prompt attends its own keys, on the model's kernel
        b, n, p = input_ids.shape[0], sampling.max_new_tokens, prefix.shape[0]
        done = ~attention_mask[:, -1].astype(bool)  # empty filler rows are done from the start
        state = DecodeState(
            cache=cache,
            tokens=jnp.full((b, n), self.pad_token_id, jnp.int32).at[:, :p].set(prefix[None, :]),
            logprobs=jnp.zeros((b, n), jnp.float32),   # forced tokens: log 1 under the restricted policy
            versions=jnp.full((b, n), -1, jnp.int32).at[:, :p].set(jnp.where(done, -1, version)[:, None]),
            done=done,
            lengths=jnp.where(done, 0, p).astype(jnp.int32),
            step=jnp.full((), p, jnp.int32),
            constraint_state=jnp.full((b,), prefix_state, jnp.int32),
            rng=rng,
        )
        return self._advance(state, logits[:, -1], version, stop_ids, tables, sampling)

    def _decode_fn(self, params, state: DecodeState, version, chunk_end, stop_ids, tables, *,
                   sampling: SamplingParams):
        """Decode steps until `chunk_end` (exclusive), max_new_tokens, or every row is done."""
        self.trace_counts["decode"] += 1

        def keep_going(s: DecodeState):
            return (s.step < chunk_end) & (s.step < sampling.max_new_tokens) & ~jnp.all(s.done)

        return jax.lax.while_loop(
            keep_going, lambda s: self.decode_step(params, s, version, stop_ids, tables, sampling), state)

    def decode_step(self, params, s: DecodeState, version, stop_ids, tables, sampling: SamplingParams) -> DecodeState:
        """One token for every unfinished row (traceable). A finished row's cache index and rope position stay
        where they are (its new key is garbage, never read by a live row), so a ragged read stops at the live
        rows' slots."""
        if s.step.ndim == 0:
            last = jax.lax.dynamic_slice_in_dim(s.tokens, s.step - 1, 1, axis=1)  # [B, 1]
        else:
            last = jnp.take_along_axis(s.tokens, jnp.clip(s.step - 1, 0, s.tokens.shape[1] - 1)[:, None], axis=1)
        logits, cache = self.module.apply({"params": params}, last, attention_mask=jnp.ones_like(last),
                                          cache=s.cache)
        live = ~s.done
        cache = dict(cache, index=jnp.where(live, cache["index"], s.cache["index"]),
                     next_position=jnp.where(live, cache["next_position"], s.cache["next_position"]))
        return self._advance(s._replace(cache=cache), logits[:, -1], version, stop_ids, tables, sampling)

    # ------------------------------------------------------------------ host side
    def _weights(self, weights) -> tuple[Any, int]:
        params, version = weights() if callable(weights) else weights
        if self._resolved is None or self._resolved[0] is not params:   # once per published version, not per chunk
            given = params
            if self._stacked_config is not None:
                params = stacking.unstack(params, self._stacked_config)
            if self.mesh is None:   # a fresh policy's, a restored checkpoint's and the trainer's: one program for all
                params = partition.committed(params)
            self._resolved = (given, params)
        params = self._resolved[1]
        if self.mesh is not None:
            if self._param_shardings is None:
                self._param_shardings = partition.param_shardings(params, self.mesh)
            params = jax.device_put(params, self._param_shardings)
        return params, int(version)

    def _tables_of(self, constraint: TokenConstraint | None):
        """(allowed [S, K] bool, next_state [S, K] int32, column [V] int32) on the device for `constraint`, its
        compact form (`TokenConstraint.compact`: a verdict grammar's tables over Qwen's vocabulary take < 1 MB, not
        ~194 MB), kept (a server passes the same few again and again); or None."""
        if constraint is None:
            return None
        if id(constraint) not in self._tables:
            if constraint.allowed.shape[1] != self.config.text.vocab_size:
                raise ValueError(f"constraint covers {constraint.allowed.shape[1]} tokens but the model's vocabulary "
                                 f"has {self.config.text.vocab_size}")
            compact = constraint.compact(min_columns=MIN_TABLE_COLUMNS)
            self._tables[id(constraint)] = (constraint, tuple(jnp.asarray(table) for table in compact))
        return self._tables[id(constraint)][1]

    def _forced_prefix(self, sampling: SamplingParams, constraint: TokenConstraint | None) -> tuple[np.ndarray, int]:
        """(tokens [P] int32, constraint state after them) that every row emits first (P = 0: none)."""
        if constraint is None:
            return np.zeros((0,), np.int32), 0
        if not self.prefill_forced:
            return np.zeros((0,), np.int32), constraint.initial_state
        key = (id(constraint), sampling.stop_token_ids, sampling.max_new_tokens)   # a server's few, again and again
        if key not in self._prefixes:
            self._prefixes[key] = constraint.forced_prefix(sampling.stop_token_ids, limit=sampling.max_new_tokens - 1)
        return self._prefixes[key]

    def _batch(self, prompts: Sequence[dict], suffix: np.ndarray):
        """Left-padded ids/mask [B', L'] of each prompt followed by `suffix`, concatenated pixel values, static
        grid. Shapes are bucketed so a new prompt length, batch size or screenshot count rarely compiles: L' is
        `bucket(L, prompt_multiple)` (at most 4 widths an octave); B' a multiple of `batch_multiple`, whose filler
        rows repeat the last prompt (ids and images) with an all-zero mask (never attended, done from the start);
        and the image list is padded to a bucket (`vision_layout.bucketed_image_order`)."""
        if min(len(p["input_ids"]) for p in prompts) < 1:
            raise ValueError("every prompt needs at least one token")
        rows = -(-len(prompts) // self.batch_multiple) * self.batch_multiple
        padded = list(prompts) + [prompts[-1]] * (rows - len(prompts))
        lengths = [len(p["input_ids"]) + len(suffix) for p in padded]
        width = bucket(max(lengths), self.prompt_multiple)
        ids = np.full((rows, width), self.pad_token_id, np.int32)
        mask = np.zeros((rows, width), np.int32)
        for row, prompt in enumerate(padded):
            ids[row, width - lengths[row]:] = np.concatenate([np.asarray(prompt["input_ids"], np.int32), suffix])
            mask[row, width - lengths[row]:] = int(row < len(prompts))
        with_images = [p for p in padded if len(p.get("image_grid_thw", ())) > 0]
        if not with_images:
            return ids, mask, None, None
        images = [image for p in with_images
                  for image in _split_images(np.asarray(p["pixel_values"], np.float32),
                                             np.asarray(p["image_grid_thw"]).reshape(-1, 3))]
        order = vision_layout.bucketed_image_order(np.arange(len(images)))   # prompts with fewer screenshots
        return (ids, mask, np.concatenate([images[i][0] for i in order], 0),
                partition.grid_key(np.stack([images[i][1] for i in order])))

    def _place(self, tree):
        """Host arrays of a batch on the mesh, split over its batch axes (`partition.data_shardings`): each device
        receives only its shard, nothing is copied whole onto one device first. Without a mesh, `tree` as it is."""
        if self.mesh is None:
            return tree
        return jax.device_put(tree, partition.data_shardings(tree, self.mesh))

    def generate(self, weights: tuple[Any, int] | Callable[[], tuple[Any, int]], prompts: Sequence[dict],
                 sampling: SamplingParams, *, seed: int | jax.Array | Sequence[int] = 0,
                 decode_text: Callable[[np.ndarray], str] | None = None,
                 constraint: TokenConstraint | None = None) -> list[SampledSequence]:
        """Generates a continuation for every prompt (see the module docstring).

        `constraint`: this call's automaton instead of the sampler's own (a judge's verdict grammar on a policy
        server); automata with as many states share the compiled steps (`TokenConstraint.padded`).

        `seed`: an int or a key for the whole batch, or one int a prompt: then each row draws from its own key,
        so a prompt with a given seed samples the same tokens whatever else is in the batch (`row_keys`).

        `decode_text(tokens) -> str` is needed only for `sampling.stop_strings` (e.g. `tokenizer.decode`).
        """
        if sampling.stop_strings and decode_text is None:
            raise ValueError("sampling.stop_strings needs decode_text (e.g. processor.tokenizer.decode)")
        constraint = self.constraint if constraint is None else constraint
        tables = self._tables_of(constraint)
        prefix, prefix_state = self._forced_prefix(sampling, constraint)
        ids, mask, pixels, grid = self._batch(prompts, prefix)
        rows, width = ids.shape
        capacity, dtype = width + sampling.max_new_tokens, jnp.dtype(self.config.dtype)
        if self.mesh is None:
            cache = kv_cache.init_cache(self.config, rows, capacity, dtype, decode_block=self.decode_block)
        else:   # each device makes its own shard: no whole cache on device 0
            cache = kv_cache.init_sharded_cache(self.config, rows, capacity, dtype, self.mesh,
                                                decode_block=self.decode_block)
        rng = row_keys(seed, len(prompts), rows)   # [rows, 2]: split with the batch on a mesh
        rng = rng if self.mesh is None else self._place(np.asarray(rng))
        stop_ids = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)
        static = dataclasses.replace(sampling, stop_token_ids=(), stop_strings=())  # stop ids are traced
        params, version = self._weights(weights)
        state = self._prefill(params, *self._place((ids, mask)), None if pixels is None else self._place(pixels),
                              cache, rng, jnp.int32(version),
                              stop_ids, tables, jnp.asarray(prefix), jnp.int32(prefix_state), grid=grid,
                              sampling=static)
        stopped_by_string: dict[int, int] = {}
        while True:
            done, step = jax.device_get((state.done, state.step))
            if sampling.stop_strings:
                state, done = self.apply_stop_strings(state, done, range(len(prompts)), sampling, decode_text,
                                                      stopped_by_string)
            if done.all() or int(step) >= sampling.max_new_tokens:
                break
            params, version = self._weights(weights)
            state = self._decode(params, state, jnp.int32(version), jnp.int32(int(step) + self.decode_chunk),
                                 stop_ids, tables, sampling=static)
        return self._results(state, prompts, sampling, stopped_by_string)

    def apply_stop_strings(self, state: DecodeState, done: np.ndarray, rows, sampling: SamplingParams,
                           decode_text, stopped: dict[int, int]):
        """Marks those of `rows` whose text contains a stop string as done, cut after the token that completes it
        (`stopped[row]` = tokens kept). Returns (state, done [B] bool)."""
        tokens, lengths = jax.device_get((state.tokens, state.lengths))
        new_done = done.copy()
        for row in rows:
            if row in stopped:
                continue
            text = decode_text(tokens[row, :lengths[row]])
            if not any(s in text for s in sampling.stop_strings):
                continue
            cut = next(n for n in range(1, lengths[row] + 1)
                       if any(s in decode_text(tokens[row, :n]) for s in sampling.stop_strings))
            stopped[row] = cut
            new_done[row] = True
        if (new_done == done).all():
            return state, done
        return state._replace(done=jnp.asarray(new_done)), new_done

    def _results(self, state: DecodeState, prompts, sampling: SamplingParams, stopped: dict[int, int]):
        arrays = jax.device_get((state.tokens, state.logprobs, state.versions, state.lengths))
        return [sequence_of(arrays, row, prompt["input_ids"], sampling, stopped.get(row))
                for row, prompt in enumerate(prompts)]


def sequence_of(arrays, row: int, prompt_ids, sampling: SamplingParams, cut: int | None) -> SampledSequence:
    """Row `row` of host copies (tokens, logprobs, versions, lengths) of a DecodeState as a SampledSequence; `cut`:
    the tokens kept when a stop string ended it (None: its own length)."""
    tokens, logprobs, versions, lengths = arrays
    n = int(lengths[row]) if cut is None else cut
    if cut is not None:
        reason = "stop_string"
    elif n > 0 and int(tokens[row, n - 1]) in sampling.stop_token_ids:
        reason = "stop_token"
    else:
        reason = "length"
    return SampledSequence(prompt_ids=np.asarray(prompt_ids, np.int32), tokens=tokens[row, :n].astype(np.int32),
                           logprobs=logprobs[row, :n].astype(np.float32),
                           versions=versions[row, :n].astype(np.int32), finish_reason=reason)


def row_keys(seed: int | jax.Array | Sequence[int], num_prompts: int, rows: int) -> jax.Array:
    """Raw keys `[rows, K]` uint32, one a row: from one seed per prompt (filler rows repeat the last), or split
    from one int seed or key."""
    if isinstance(seed, (int, np.integer)):
        seed = jax.random.PRNGKey(int(seed))
    if isinstance(seed, jax.Array):
        return jax.random.split(seed, rows)
    seeds = [int(s) for s in seed]
    if len(seeds) != num_prompts:
        raise ValueError(f"seed: {len(seeds)} seeds for {num_prompts} prompts; pass one a prompt, or one int")
    if not all(0 <= s < 2**32 for s in seeds):
        raise ValueError(f"seed: per-prompt seeds must be in [0, 2**32), got {seeds}")
    return _keys_from_seeds(np.asarray(seeds + seeds[-1:] * (rows - num_prompts), np.uint32))


_keys_from_seeds = jax.jit(jax.vmap(jax.random.PRNGKey))


def _split_images(pixel_values: np.ndarray, grid: np.ndarray):
    """(pixels [t*h*w, D], grid row [3]) of each image of one prompt (its patches are stored image by image)."""
    start = 0
    for row in grid:
        count = int(np.prod(row))
        yield pixel_values[start:start + count], row
        start += count
