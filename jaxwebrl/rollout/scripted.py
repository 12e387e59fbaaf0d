"""DIAGNOSTIC / TEST policy backend: scripted action text, real tokens. No neural network, never for training.

``ScriptedBackend`` is a policy-server handler (``handler(request) -> reply``, see ``rollout/client.py``) whose
replies are produced by a responder (random valid action texts, or the toy task's oracle) but whose token
fields are made the way the real server makes them: the chat template and tokenizer of a real
``jaxwebrl.models`` processor render the prompt (image placeholders expanded from the screenshots read by
reference when ``fetch_image`` is given), the response is tokenized and ended with EOS, ``loss_mask`` marks
the response tokens, ``versions`` carries the backend's current version, and ``behave_logprobs`` spreads the
log-probability of the scripted choice evenly over the response tokens (their sum is log P(choice)).

Use it to exercise workers, the buffer and the trainer's data path without a model.

Why it ships in the package and not under tests/: measurements a user runs drive real rollout workers with it
(`bench/env.py`: oracle MiniWoB++ steps/s and the worker's overhead; `bench/ray_overhead.py`: local vs Ray
workers behind the real transport), and a worker pool's spec may name it (`{"kind": "scripted", ...}`, built in
the worker process by `worker_process.build_worker`) so a pool runs without a policy server.
"""

from __future__ import annotations

import json
import math
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxwebrl.env.tasks.toy import toy
from jaxwebrl.env.agent.prompt import read_goal_and_step
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import GENERATE_OP, Generation

Responder = Callable[[dict, np.random.Generator], tuple[str, float]]  # -> (response text, log P(choice))


def _with_memory(action_text: str, step: int | None) -> str:
    memory = {"steps_taken": step} if step is not None else {}
    return f"Memory: {json.dumps(memory)}\nAction: {action_text}"


def random_choice_responder(texts: Sequence[str], write_memory: bool = True) -> Responder:
    """Uniform choice among ``texts`` (action texts; invalid ones allowed, to test feedback paths)."""
    texts = list(texts)
    if not texts:
        raise ValueError("random_choice_responder needs at least one text")

    def respond(request: dict, rng: np.random.Generator) -> tuple[str, float]:
        text = texts[int(rng.integers(len(texts)))]
        step = _step_or_none(request["messages"])
        return (_with_memory(text, step) if write_memory else text), -math.log(len(texts))

    return respond


def toy_oracle_responder(epsilon: float = 0.0) -> Responder:
    """The toy task's correct press with probability 1 - epsilon/2 (epsilon-uniform over the two buttons)."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"toy_oracle_responder epsilon must be in [0, 1], got {epsilon}")

    def respond(request: dict, rng: np.random.Generator) -> tuple[str, float]:
        goal, step = read_goal_and_step(request["messages"])
        correct = toy.oracle_action_text(goal, min(step, toy.NUM_TURNS - 1))
        if rng.random() < epsilon:
            text = toy.ACTION_TEXTS[int(rng.integers(2))]
        else:
            text = correct
        prob = (1.0 - epsilon / 2) if text == correct else epsilon / 2
        return _with_memory(text, step), math.log(prob)

    return respond


def _step_or_none(messages: list[dict]) -> int | None:
    try:
        return read_goal_and_step(messages)[1]
    except ValueError:
        return None


RESPONDERS = {"random": random_choice_responder, "toy_oracle": toy_oracle_responder}


class ScriptedBackend:
    """Scripted policy-server handler (TEST / DIAGNOSTIC ONLY, see module docstring).

    responder: makes the response text and its log-probability.
    processor: a ``jaxwebrl.models`` Processor (default: the tiny preset's) for the chat template and tokens.
    fetch_image: ref -> uint8 [H, W, 3] (e.g. ``buffer.screenshots.get``); given, the prompt's image
      placeholders are expanded as the real server does; None keeps one placeholder token per image.
    version: policy version stamped on generated tokens (``set_version`` changes it, as a publish would).
    delay_s: sleep per request, to emulate generation time in throughput tests.
    """

    def __init__(self, responder: Responder, processor=None, fetch_image: Callable[[int], np.ndarray] | None = None,
                 version: int = 0, seed: int = 0, delay_s: float = 0.0):
        if processor is None:
            processor = tiny_processor()
        self.processor = processor
        self._responder = responder
        self._fetch_image = fetch_image
        self._eos = processor.tokenizer.eos_token_id
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.version = int(version)
        self.delay_s = float(delay_s)
        self.requests = 0

    @classmethod
    def from_config(cls, config: dict[str, Any], fetch_image=None) -> "ScriptedBackend":
        """From JSON config: {"responder": "random", "texts": [...]} or {"responder": "toy_oracle",
        "epsilon": 0.1}; optional "seed", "version", "delay_s"."""
        config = dict(config)
        name = config.pop("responder", None)
        if name not in RESPONDERS:
            raise ValueError(f"scripted backend responder must be one of {sorted(RESPONDERS)}, got {name!r}")
        options = {k: config.pop(k) for k in ("seed", "version", "delay_s") if k in config}
        try:
            responder = RESPONDERS[name](**config)
        except TypeError as exc:
            raise ValueError(f"bad options for scripted responder {name!r}: {exc}") from None
        return cls(responder, fetch_image=fetch_image, **options)

    def set_version(self, version: int) -> None:
        self.version = int(version)

    def __call__(self, request: dict) -> dict:
        if request.get("op") != GENERATE_OP:
            raise ValueError(f"scripted backend serves op {GENERATE_OP!r} only, got {request.get('op')!r}")
        messages, refs = request["messages"], [int(r) for r in np.asarray(request["image_refs"]).reshape(-1)]
        with self._lock:
            rng = (np.random.default_rng(request["seed"]) if request.get("seed") is not None
                   else np.random.default_rng(self._rng.integers(2**63)))
            version = self.version
            self.requests += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self._fetch_image is not None:
            prompt_ids = self.processor(messages, [self._fetch_image(r) for r in refs])["input_ids"]
        else:
            prompt_ids = self.processor.tokenizer.encode(self.processor.render(messages), add_special_tokens=False)
        text, logprob = self._responder(request, rng)
        response_ids = self.processor.tokenizer.encode(text, add_special_tokens=False)
        if self._eos is not None:
            response_ids = np.append(response_ids, np.int32(self._eos))
        response_ids = response_ids[: int(request["max_new_tokens"])]
        text = self.processor.tokenizer.decode(response_ids, skip_special_tokens=True)
        n_prompt, n_response = len(prompt_ids), len(response_ids)
        policy = np.concatenate([np.zeros(n_prompt, np.int8), np.ones(n_response, np.int8)])
        return Generation(
            text=text,
            input_ids=np.concatenate([prompt_ids, response_ids]).astype(np.int32),
            loss_mask=policy,
            behave_logprobs=policy.astype(np.float32) * np.float32(logprob / n_response),
            versions=np.where(policy == 1, version, -1).astype(np.int32),
        ).to_reply()
