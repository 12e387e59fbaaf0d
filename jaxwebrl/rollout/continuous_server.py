"""The JAX policy server with continuous batching (`rollout.continuous_batching = True`; off by default).

The same contract with workers as `PolicyServer` (requests, replies, per-token versions and behaviour log-probs,
weight swaps between decode chunks, pause/resume, admission of groups), served from `max_batch` decode slots
(`models/continuous_batching.ContinuousBatcher`) instead of static batches: at every chunk boundary of
`decode_chunk` tokens, rows that stopped are answered at once and leave, and queued requests are prefilled into
the free slots and decode on beside the others. A request that arrives while others decode waits at most one
chunk for a free slot, not a whole generation. `server_deadline_ms` has no role here (admission happens at every
boundary).

Requests of one (max_new_tokens, temperature, top_p) setting share the slots; the oldest waiting request picks the
setting: a request of another setting stops admissions until the slots drain, then the slots switch to it (one
batcher a setting, its programs compiled once). An engine-judge verdict is a setting of its own, as in the static
server: (facts, reference, check_blocked), decoded greedily under that verdict grammar (rollout/verdict_decoding.py),
so verdicts decode beside each other, never beside policy rows, and a verdict waits for the slots to drain.
`pause()` admits nothing new; rows in flight decode to their end.
Reply timing: `queue_s` until admission, `encode_s` the request's own, `compute_s` from admission to its answer,
`batch_size` the rows decoding after its admission, `compiled` whether a program was traced meanwhile. Stats count
one batch per admission. `close()` fails the requests waiting or in flight at once ("policy server closed").

Whether this pays on an accelerator is measured, not assumed (`bench/continuous_batching.py` on the CPU,
`bench/device_check.py decode` variant `continuous` on a GPU).
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue
import time

from jaxwebrl.models.continuous_batching import ContinuousBatcher
from jaxwebrl.rollout.client import JUDGE_OP
from jaxwebrl.rollout.policy_server import PolicyServer, _setting, _settle

log = logging.getLogger(__name__)


class ContinuousPolicyServer(PolicyServer):
    """`PolicyServer` whose batching thread runs continuous batching (see the module docstring)."""

    def _serve(self) -> None:
        self._batchers: dict[tuple, ContinuousBatcher] = {}
        self._active: tuple | None = None
        self._tags = itertools.count()
        waiting: collections.deque = collections.deque()   # (request, future, queued_at) not yet admitted
        in_flight: dict[int, tuple] = {}                     # tag -> (future, compute_from, timing, traces)
        while not self._closed.is_set():
            self._take_queued(waiting, block=not in_flight and not waiting)
            if not self._running.is_set() and not in_flight:
                self._running.wait(0.1)
                continue
            admitting = bool(waiting) and self._running.is_set()
            if not (admitting or in_flight):
                continue
            with self._busy.running():
                if admitting:
                    self._admit(waiting, in_flight)
                if in_flight:
                    self._decode_chunk(in_flight)
        closed = RuntimeError("policy server closed")   # rows in flight are not decoded to their end
        self._fail_all(in_flight, closed, [future for _, future, _ in waiting])

    def _take_queued(self, waiting: collections.deque, *, block: bool) -> None:
        try:
            if block:
                waiting.append(self._requests.get(timeout=0.1))
            while True:
                waiting.append(self._requests.get_nowait())
        except queue.Empty:
            pass

    def _batcher(self, setting: tuple) -> ContinuousBatcher:
        """The slots of `setting`, made active (the previous setting's slots are idle: their cache is dropped)."""
        if self._active is not None and self._active != setting:
            self._batchers[self._active].release()
        if setting not in self._batchers:
            sampling, constraint = self._decoding(setting)   # a verdict's grammar, or the policy's (None)
            self._batchers[setting] = ContinuousBatcher(self._sampler, sampling, self.max_batch, constraint=constraint)
        self._active = setting
        return self._batchers[setting]

    def _traces(self) -> int:
        return sum(self._sampler.trace_counts.values()) + sum(
            sum(b.trace_counts.values()) for b in self._batchers.values())

    def _admit(self, waiting: collections.deque, in_flight: dict) -> None:
        """Prefills the oldest waiting requests of the active setting into the free slots (switching the setting
        when the slots are idle and the oldest request has another)."""
        setting = _setting(waiting[0][0])
        active = self._batchers.get(self._active)
        if active is not None and active.occupied and setting != self._active:
            return   # drain first: the oldest request has another setting
        batcher = self._batcher(setting)
        group = []
        while waiting and len(group) < batcher.free_slots and _setting(waiting[0][0]) == setting:
            group.append(waiting.popleft())
        start, traces = time.monotonic(), self._traces()
        prompts, members = [], []
        for request, future, queued_at in group:
            t0 = time.perf_counter()
            try:
                prompts.append(self._encode(request))
            except Exception as exc:  # noqa: BLE001 - this request fails alone, its worker hears why
                _settle(future, error=exc)
                continue
            members.append((request, future, queued_at, time.perf_counter() - t0))
        if not members:
            return
        tags = [next(self._tags) for _ in members]
        compute_from = time.monotonic()
        try:
            batcher.admit(self.weights, prompts, [self._seed(request) for request, *_ in members], tags)
        except Exception as exc:  # noqa: BLE001 - every admitted and decoding request hears about it
            log.exception("policy server admission of %d failed", len(members))
            self._fail_all(in_flight, exc, [future for _, future, _, _ in members])
            return
        for tag, (_, future, queued_at, encode_s) in zip(tags, members):
            timing = {"queue_s": start - queued_at, "encode_s": encode_s, "batch_size": batcher.occupied}
            in_flight[tag] = (future, compute_from, timing, traces)
        self._count([], batches=1)

    def _decode_chunk(self, in_flight: dict) -> None:
        """One chunk of the active slots; answers the rows that stopped."""
        try:
            finished = self._batchers[self._active].decode_chunk(self.weights)
        except Exception as exc:  # noqa: BLE001 - every decoding request hears about it
            log.exception("policy server decode chunk of %d rows failed", len(in_flight))
            self._fail_all(in_flight, exc, [])
            return
        now, traces = time.monotonic(), self._traces()
        reply_of = self._verdict_reply if self._active[0] == JUDGE_OP else self._reply   # the slots' one setting
        replies = []
        for tag, result in finished:
            future, compute_from, timing, traces_then = in_flight.pop(tag)
            reply = dict(reply_of(result), timing=dict(timing, compute_s=now - compute_from,
                                                          compiled=traces > traces_then))
            _settle(future, result=reply)
            replies.append(reply)
        self._count(replies, batches=0)

    def _fail_all(self, in_flight: dict, error: BaseException, others: list) -> None:
        """Fails every request in flight and `others` (futures); the active slots start empty again."""
        for future in [entry[0] for entry in in_flight.values()] + others:
            _settle(future, error=error)
        in_flight.clear()
        self._batchers.pop(self._active, None)   # its state may have been donated to the failed call
        self._active = None
