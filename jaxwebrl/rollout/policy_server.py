"""The policy server: batched generation for every rollout worker, with versioned, hot-swapped weights.

It plugs into the transport as its handler (`TransportServer(server.handle, ...)`): each worker request
(`{"op": "generate", "messages", "image_refs", ...}`, docs/interfaces.md) is queued; a batching thread takes the
first queued request and whatever else is queued at that moment (up to `max_batch`; no request waits for a full
batch, unless `deadline_ms` > 0 asks it to wait that long for more), reads their screenshots by reference from the
ring buffer, applies the processor (chat template + image processor, so tokens and pixels
agree by construction), and decodes them together with the KV-cache sampler. The reply carries the prompt and
response tokens, the behaviour log-prob of every sampled token, the policy version that produced it, and
`timing` (rollout/client.py SERVER_TIMING_FIELDS: queued, encoding and sampler seconds of the request's batch).

A request that names its (worker, group) may wait first: a worker's new group is admitted only while the
trainer can use it (`set_admission`, rollout/admission.py).

It also judges: a `{"op": "judge", ...}` request (the engine judge, rollout/engine_judge.py) joins the same
batches and is decoded by the same weights, greedily, under its verdict grammar (rollout/verdict_decoding.py); it
is never held by admission control, and its tokens are counted apart (judge_requests, judge_tokens), never as
policy tokens.

`set_weights(params, version)` (the trainer, after each update) swaps the weights between decode chunks of
`decode_chunk` tokens, so a long generation may span versions and records that per token. The server decodes
from weights in `serve_dtype` (None: the model's compute dtype): floating leaves that arrive in another dtype are
cast once on receipt (the trainer already publishes that copy; `models/serving_weights.py` says what bf16 serving
changes in the behaviour log-probs). `pause()`/`resume()` hold new batches back (synchronous mode).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from typing import Any

import numpy as np

from jaxwebrl.env.agent.action_space import MemoryGrammar, config_memory_grammar
from jaxwebrl.env.registry import config_action_texts
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.sampler import Sampler, SamplingParams
from jaxwebrl.models.serving_weights import serving_dtype
from jaxwebrl.parallel.partition import cast_floating
from jaxwebrl.rollout.action_grammar import action_constraint
from jaxwebrl.rollout.admission import Admission
from jaxwebrl.rollout.busy_clock import BusyClock
from jaxwebrl.rollout.client import JUDGE_OP
from jaxwebrl.rollout.verdict_decoding import VerdictGrammars, check_judge_request
from jaxwebrl.rollout.wire import RequestRefused

log = logging.getLogger(__name__)


class PolicyServer:
    """Batched, versioned generation (see module docstring)."""

    def __init__(self, policy, buffer, *, max_batch: int = 8, deadline_ms: float = 0.0, decode_chunk: int = 8,
                 top_k: int = 0, action_texts: tuple[str, ...] | None = None, memory: MemoryGrammar | None = None,
                 seed: int = 0, group_size: int = 1, serve_dtype: str | None = None,
                 decode_block: int = 0):
        self.policy = policy
        self.processor = policy.processor
        self.buffer = buffer
        self.max_batch = int(max_batch)
        self.deadline_s = float(deadline_ms) / 1000.0
        self.decode_chunk = int(decode_chunk)
        self.top_k = int(top_k)
        self.action_texts = tuple(action_texts) if action_texts else None
        self.memory = memory    # the free memory grammar of the constrained responses (None: Memory: {})
        self.serve_dtype = serving_dtype(serve_dtype, policy.config)
        self.decode_block = int(decode_block)
        self._weights_lock = threading.Lock()
        self._params, self._version = cast_floating(policy.params, self.serve_dtype), 0
        self._requests: queue.Queue = queue.Queue()
        self._running = threading.Event()
        self._running.set()
        self._closed = threading.Event()
        self._failure: str | None = None  # set when the batching thread died: handle() then fails at once
        self._rng = np.random.default_rng(seed)
        self._stats_lock = threading.Lock()
        self._stats = {"requests": 0, "batches": 0, "generated_tokens": 0, "prompt_tokens": 0,
                       "judge_requests": 0, "judge_tokens": 0}
        self._busy = BusyClock()   # busy_s of stats(): a batch still decoding counts up to the read
        self.admission = Admission(group_size)   # gated once the trainer calls set_admission
        self._sampler = self._make_sampler()
        self._verdicts = VerdictGrammars(self.processor, policy.config.text.vocab_size)
        self._thread = threading.Thread(target=self._serve_forever, name="policy-server", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, policy, buffer, config) -> "PolicyServer":
        r = config.rollout
        texts = config_action_texts(config)
        return cls(policy, buffer, max_batch=r.server_max_batch, deadline_ms=r.server_deadline_ms,
                   decode_chunk=r.decode_chunk, top_k=config.model.top_k, action_texts=texts,
                   memory=config_memory_grammar(config), seed=config.seed, group_size=config.env.group_size,
                   serve_dtype=r.serve_dtype, decode_block=r.decode_block)

    # ------------------------------------------------------------------ trainer side
    def set_weights(self, params, version: int) -> None:
        """Publish `params` as policy version `version`; in-flight generations switch at their next chunk. Floating
        leaves not in `serve_dtype` are cast to it (leaves already in it are used as they are, not copied)."""
        params = cast_floating(params, self.serve_dtype)
        with self._weights_lock:
            self._params, self._version = params, int(version)

    def weights(self) -> tuple[Any, int]:
        with self._weights_lock:
            return self._params, self._version

    @property
    def version(self) -> int:
        return self.weights()[1]

    def set_admission(self, capacity: int, backlog: int) -> None:
        """The trainer's admission limit (rollout/admission.py): at most `capacity` trajectories in flight or
        unconsumed, `backlog` of them read by the trainer and waiting."""
        self.admission.set_limit(capacity, backlog)

    def pause(self) -> None:
        """Start no new batch until `resume()` (a batch being decoded finishes)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stats(self) -> dict:
        with self._stats_lock:
            return dict(self._stats, busy_s=self._busy.seconds(), version=self.version,
                        admission_wait_s=self.admission.waited_s)

    def raise_if_failed(self) -> None:
        """RuntimeError (one line) when the batching thread died: no request would be answered any more."""
        if self._failure is not None:
            raise RuntimeError(f"policy server stopped: {self._failure}")
        if not self._thread.is_alive() and not self._closed.is_set():
            raise RuntimeError("policy server stopped: its batching thread exited")

    def close(self) -> None:
        self._closed.set()
        self.admission.close()
        self._running.set()
        self._thread.join(timeout=30)
        self._fail_queued(RuntimeError("policy server closed"))

    def _fail_queued(self, error: BaseException) -> None:
        """Fail whatever is still queued, so no handler thread waits forever."""
        while True:
            try:
                _, future, _ = self._requests.get_nowait()
            except queue.Empty:
                break
            _settle(future, error=error)

    # ------------------------------------------------------------------ transport side
    def handle(self, request: dict) -> dict:
        """Transport handler: one generate or judge request -> its reply (blocks until its batch is decoded)."""
        judging = request.get("op") == JUDGE_OP
        if judging:   # a bad request fails alone, never the batch it would have joined
            check_judge_request(request)
        else:
            _check_request(request)
        if self._closed.is_set():
            raise RuntimeError("policy server closed")
        self.raise_if_failed()
        if judging:   # its grammar is built here, once, never on the batching thread
            self._verdicts.decoding(request["facts"], request["reference"], request["check_blocked"])
        elif "group_id" in request:   # a worker's new group waits until the trainer can use it
            self.admission.enter(request["worker_id"], request["group_id"], stop=self._closed.is_set)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((request, future, time.monotonic()))
        while True:
            try:
                return future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if not self._thread.is_alive():  # stopped or died after this request was queued
                    error = RuntimeError(f"policy server stopped: {self._failure or 'closed'}")
                    _settle(future, error=error)
                    self._fail_queued(error)

    # ------------------------------------------------------------------ batching thread
    def _next_batch(self) -> list:
        while not self._closed.is_set():
            self._running.wait()
            try:
                first = self._requests.get(timeout=0.1)
            except queue.Empty:
                continue
            batch = [first]
            deadline = time.monotonic() + self.deadline_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                try:   # whatever is queued joins at once; only a deadline > 0 waits for more
                    batch.append(self._requests.get(timeout=remaining) if remaining > 0 else
                                 self._requests.get_nowait())
                except queue.Empty:
                    break
            self._running.wait()  # paused while filling: hold the batch until resumed
            return batch
        return []

    def _serve_forever(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - recorded; handle() and raise_if_failed() report it
            self._failure = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            log.error("policy server batching thread died: %s", self._failure)
            self._fail_queued(RuntimeError(f"policy server stopped: {self._failure}"))

    def _serve(self) -> None:
        while not self._closed.is_set():
            batch = self._next_batch()
            if not batch:
                continue
            with self._busy.running():
                self._serve_batch(batch)

    def _serve_batch(self, batch: list) -> None:
        """Decodes one batch of (request, future, queued_at) and settles every future."""
        start = time.monotonic()
        try:
            replies = self._generate([request for request, _, _ in batch])
        except Exception as exc:  # noqa: BLE001 - every waiting worker must hear about it
            log.exception("policy server batch of %d failed", len(batch))
            for _, future, _ in batch:
                _settle(future, error=exc)
            return
        for (_, future, queued_at), reply in zip(batch, replies):
            if isinstance(reply, Exception):   # its own request could not be encoded: it fails alone
                _settle(future, error=reply)
                continue
            reply["timing"]["queue_s"] = start - queued_at
            _settle(future, result=reply)
        self._count([r for r in replies if not isinstance(r, Exception)], batches=1)

    def _count(self, replies: list[dict], *, batches: int) -> None:
        """Adds answered `replies` and `batches` batches decoded (or admitted) to the stats; a verdict's tokens
        count apart (judge_requests, judge_tokens), never as policy tokens."""
        with self._stats_lock:
            self._stats["batches"] += batches
            for reply in replies:
                if "loss_mask" not in reply:   # a verdict: no policy token
                    self._stats["judge_requests"] += 1
                    self._stats["judge_tokens"] += reply["num_tokens"]
                    continue
                policy_tokens = int(reply["loss_mask"].sum())
                self._stats["requests"] += 1
                self._stats["generated_tokens"] += policy_tokens
                self._stats["prompt_tokens"] += len(reply["loss_mask"]) - policy_tokens

    def _make_sampler(self) -> Sampler:
        tokenizer = self.processor.tokenizer
        constraint = None
        if self.action_texts:
            constraint = action_constraint(self.processor, self.action_texts, self.policy.config.text.vocab_size,
                                           memory=self.memory)
        return Sampler(self.policy.module, self.policy.config, pad_token_id=tokenizer.pad_token_id or 0,
                       decode_chunk=self.decode_chunk, batch_multiple=min(4, self.max_batch), constraint=constraint,
                       decode_block=self.decode_block)

    def _encode(self, request: dict) -> dict:
        if request["op"] == JUDGE_OP:   # a verdict's screenshots come with it (not episode steps of the buffer)
            return self.processor(request["messages"], request["images"])
        refs = np.asarray(request["image_refs"], np.int64).reshape(-1)
        images = [self.buffer.screenshots.get(int(r)) for r in refs]
        return self.processor(request["messages"], images)

    def _generate(self, requests: list[dict]) -> list[dict | Exception]:
        """Replies for `requests`, decoded together per distinct setting (usually one; verdicts apart); a request
        that cannot be encoded (a screenshot gone from the store, an image the processor refuses), or whose setting's
        decode raises, gets its error instead, and the others decode without it."""
        replies: list[dict | Exception | None] = [None] * len(requests)
        by_setting: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            by_setting.setdefault(_setting(request), []).append(i)
        for setting, members in by_setting.items():
            t0 = time.perf_counter()
            encoded = {}
            for i in members:
                try:
                    encoded[i] = self._encode(requests[i])
                except Exception as exc:  # noqa: BLE001 - this request fails alone, its worker hears why
                    replies[i] = exc
            if not encoded:
                continue
            members, prompts = list(encoded), list(encoded.values())
            sampling, verdict = self._decoding(setting)
            seeds = [self._seed(requests[i]) for i in members]
            traces = sum(self._sampler.trace_counts.values())
            t1 = time.perf_counter()
            try:
                results = self._sampler.generate(self.weights, prompts, sampling, seed=seeds, constraint=verdict)
            except Exception as exc:  # noqa: BLE001 - this setting's requests fail; the other settings' stand
                log.exception("policy server: decoding %d request(s) of one setting failed", len(members))
                for i in members:
                    replies[i] = exc
                continue
            t2 = time.perf_counter()
            timing = {"encode_s": t1 - t0, "compute_s": t2 - t1, "batch_size": len(members),
                      "compiled": sum(self._sampler.trace_counts.values()) > traces}
            for i, result in zip(members, results):
                reply = self._reply(result) if verdict is None else self._verdict_reply(result)
                replies[i] = dict(reply, timing=dict(timing))
        return replies

    def _decoding(self, setting: tuple) -> tuple[SamplingParams, TokenConstraint | None]:
        """(SamplingParams, the verdict grammar, or None for the policy's own constraint) of a setting."""
        if setting[0] == JUDGE_OP:
            constraint, sampling = self._verdicts.decoding(*setting[1:])
            return sampling, constraint
        return self._sampling(setting), None

    def _sampling(self, setting: tuple) -> SamplingParams:
        """The SamplingParams of a (max_new_tokens, temperature, top_p) setting (`_setting`)."""
        max_new_tokens, temperature, top_p = setting
        eos = self.processor.tokenizer.eos_token_id
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_k=self.top_k, top_p=top_p,
                              stop_token_ids=() if eos is None else (eos,))

    def _seed(self, request: dict) -> int:
        """The request's own seed (its draw is then independent of the rows around it), else a fresh one."""
        return int(self._rng.integers(2**31 - 1)) if request.get("seed") is None else int(request["seed"])

    def _verdict_reply(self, result) -> dict:
        """A judge request's reply: the verdict's text, the version that judged it and its token count (no policy
        tokens)."""
        return {"text": self.processor.decode(result.tokens, skip_special_tokens=True),
                "version": int(result.versions.max(initial=-1)), "num_tokens": len(result.tokens)}

    def _reply(self, result) -> dict:
        """Prompt + response tokens. behave_logprobs are the log-probs of the distribution each token was drawn
        from (action grammar, temperature, top-k, top-p: `sampler.sampling_logits`), which the trainer replays, so
        the ratio is exactly one for unchanged weights; versions are the weights version that produced each token."""
        prompt, tokens = result.prompt_ids, result.tokens
        n_prompt, n = len(prompt), len(tokens)
        return {
            "text": self.processor.decode(tokens, skip_special_tokens=True),
            "input_ids": np.concatenate([prompt, tokens]).astype(np.int32),
            "loss_mask": np.concatenate([np.zeros(n_prompt, np.int8), np.ones(n, np.int8)]),
            "behave_logprobs": np.concatenate([np.zeros(n_prompt, np.float32), result.logprobs.astype(np.float32)]),
            "versions": np.concatenate([np.full(n_prompt, -1, np.int32), result.versions.astype(np.int32)]),
        }


def _setting(request: dict) -> tuple:
    """(max_new_tokens, temperature, top_p), or a verdict's ("judge", facts, reference, check_blocked): requests of
    one setting decode together (one compiled program)."""
    if request["op"] == JUDGE_OP:
        return JUDGE_OP, request["facts"], request["reference"], request["check_blocked"]
    return (int(request["max_new_tokens"]), float(request.get("temperature", 1.0)), float(request.get("top_p", 1.0)))


def _settle(future: concurrent.futures.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Complete `future` unless something else (close, a dead thread) already did."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _check_request(request: dict) -> None:
    """ValueError naming the field when a generate request (docs/interfaces.md) is malformed."""
    if request.get("op") != "generate":
        raise RequestRefused(f"policy server serves ops 'generate' and '{JUDGE_OP}' only, got {request.get('op')!r}")
    messages, refs = request.get("messages"), request.get("image_refs")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RequestRefused("generate request 'messages' must be a list of chat message dicts")
    if not isinstance(refs, np.ndarray) or refs.dtype.kind not in "iu" or refs.ndim != 1:
        raise RequestRefused("generate request 'image_refs' must be an int array [K] of screenshot refs")
    max_new = request.get("max_new_tokens")
    if type(max_new) is not int or max_new < 1:
        raise RequestRefused(f"generate request 'max_new_tokens' must be an int >= 1, got {max_new!r}")
    temperature, top_p = request.get("temperature", 1.0), request.get("top_p", 1.0)
    if type(temperature) not in (int, float) or not np.isfinite(temperature) or temperature < 0:
        raise RequestRefused(f"generate request 'temperature' must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if type(top_p) not in (int, float) or not 0 < top_p <= 1:
        raise RequestRefused(f"generate request 'top_p' must be a number in (0, 1], got {top_p!r}")
    seed = request.get("seed")
    if seed is not None and (type(seed) is not int or not 0 <= seed < 2**32):
        raise RequestRefused(f"generate request 'seed' must be None or an int in [0, 2**32), got {seed!r}")
    if ("worker_id" in request) != ("group_id" in request) or any(
            type(request[k]) is not int for k in ("worker_id", "group_id") if k in request):
        raise RequestRefused("generate request 'worker_id' and 'group_id' must be given together, as ints")
