"""The policy server's side of the engine judge (`rollout/engine_judge.py`): a judge request checked, and the verdict
grammar it is decoded under, greedily, so that its verdict always parses.

A judge request (docs/interfaces.md, "judge request"):

    {"op": "judge", "messages": [...HF chat, one {"type": "image"} per screenshot...],
     "images": [uint8 [H, W, 3], ...], "facts": int, "reference": bool, "check_blocked": bool}

carries its screenshots' pixels (a verdict is not an episode step: its images are not read by reference from the
ring buffer) and is answered {"text": the verdict, JSON of `judge.verdict_schema(facts, reference, check_blocked)`, "version":
the policy version that judged it, "num_tokens", "timing"}. It names no group, so admission control never holds
it, and its tokens are no policy tokens: nothing of it reaches the buffer or the trainer (the server counts
judge_requests, judge_tokens).

    grammars = VerdictGrammars(processor, vocab_size)
    constraint, sampling = grammars.decoding(facts=3, reference=True, check_blocked=True)   # cached; greedy

Each verdict automaton is padded to a power of two states (at least MIN_STATES), and its token budget is that
count (an acyclic automaton's longest path), so rubrics of 0 to 16 facts share one compiled decode (92 + 10 · facts
states with the tiny byte-level tokenizer).
"""

from __future__ import annotations

import threading

import numpy as np

from jaxwebrl.env.tasks.webgym.judge import verdict_regex
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.sampler import SamplingParams
from jaxwebrl.rollout.wire import RequestRefused

MAX_FACTS = 64        # rubric facts a judge request may carry (WebGym's hard tasks have 7 or more)
MIN_STATES = 256      # verdict automata are padded to a power of two states, at least this many


class VerdictGrammars:
    """The verdict automaton and sampling of each (facts, reference, check_blocked) a server has judged (built once
    each)."""

    def __init__(self, processor, vocab_size: int):
        self.tokenizer, self.vocab_size = processor.tokenizer, int(vocab_size)
        self._built: dict[tuple[int, bool, bool], tuple[TokenConstraint, SamplingParams]] = {}
        self._building: dict[tuple[int, bool, bool], threading.Lock] = {}   # one lock a grammar: built once
        self._lock = threading.Lock()   # guards the two dicts only, never held while a grammar is built

    def decoding(self, facts: int, reference: bool, check_blocked: bool) -> tuple[TokenConstraint, SamplingParams]:
        """(constraint `[S, V]`, greedy SamplingParams) of a verdict on `facts` facts, with a reference answer or
        without (reference_matched null), blocked a choice or always false. A grammar being built holds up only
        the requests for that same grammar."""
        key = (int(facts), bool(reference), bool(check_blocked))
        with self._lock:
            if key in self._built:
                return self._built[key]
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._lock:
                if key in self._built:   # built by the request this one waited for
                    return self._built[key]
            eos = self.tokenizer.eos_token_id
            exact = TokenConstraint.from_regex(verdict_regex(*key), self.tokenizer.token_strings(self.vocab_size), eos)
            states = max(MIN_STATES, 1 << (len(exact.allowed) - 1).bit_length())
            built = (exact.padded(states),
                     SamplingParams(max_new_tokens=states, temperature=0.0, stop_token_ids=(eos,)))
            with self._lock:
                self._built[key] = built
            return built


def check_judge_request(request: dict) -> None:
    """RequestRefused naming the field when a judge request (module docstring) is malformed."""
    messages, images = request.get("messages"), request.get("images")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RequestRefused("judge request 'messages' must be a list of chat message dicts")
    if not isinstance(images, list) or not all(isinstance(i, np.ndarray) and i.dtype == np.uint8 and i.ndim == 3
                                               and i.shape[-1] == 3 for i in images):
        raise RequestRefused("judge request 'images' must be a list of uint8 [H, W, 3] screenshots")
    slots = sum(isinstance(item, dict) and item.get("type") == "image" for m in messages
                for item in (m.get("content") if isinstance(m.get("content"), list) else []))
    if slots != len(images):
        raise RequestRefused(f"judge request 'messages' hold {slots} image items but {len(images)} images came")
    facts = request.get("facts")
    if type(facts) is not int or not 0 <= facts <= MAX_FACTS:
        raise RequestRefused(f"judge request 'facts' must be an int in [0, {MAX_FACTS}], got {facts!r}")
    for flag in ("reference", "check_blocked"):
        if type(request.get(flag)) is not bool:
            raise RequestRefused(f"judge request {flag!r} must be a bool, got {request.get(flag)!r}")
