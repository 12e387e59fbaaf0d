"""How rollout workers ask the policy server for an action: ``generate(messages, image_refs) -> Generation``.

The request travels as a plain dict (docs/interfaces.md, "generate request"):

    {"op": "generate", "messages": [...HF chat...], "image_refs": int64 [K],
     "max_new_tokens": int, "temperature": float, "top_p": float, "seed": int | None,
     "worker_id": int, "group_id": int}                # optional: admission control (rollout/admission.py)

and the server's handler answers with ``{"text": str, "input_ids": int32 [L], "loss_mask": int8 [L],
"behave_logprobs": float32 [L], "versions": int32 [L]}`` (prompt + response tokens of this step).

``PolicyClient`` sends it over the pyzmq transport; ``InProcessClient`` calls a handler directly (tests,
single-process tools) but still encodes and decodes the message, so a handler that works in-process works
over the wire.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from jaxwebrl.rollout.transport import TransportClient
from jaxwebrl.rollout.wire import decode_message, encode_message

GENERATE_OP = "generate"
JUDGE_OP = "judge"   # a verdict of the engine judge (rollout/engine_judge.py; rollout/verdict_decoding.py)
# What a policy server may report per request (reply["timing"]): seconds queued before its batch started, spent
# rendering prompts (chat template, screenshots read by reference, image processor), and in the sampler (prefill +
# decode of the whole batch, compilation included); the batch's size, and 1.0 when that batch compiled.
SERVER_TIMING_FIELDS = ("queue_s", "encode_s", "compute_s", "batch_size", "compiled")


@dataclasses.dataclass(frozen=True)
class Generation:
    """One policy reply for one browser step.

    text: the response text (decoded policy tokens, special tokens removed).
    input_ids: int32 [L] prompt + response tokens. loss_mask: int8 [L], 1 on policy-generated tokens.
    behave_logprobs: float32 [L], sampling log-prob of each policy token, 0 elsewhere.
    versions: int32 [L], policy version that produced each token, -1 on prompt tokens.
    timing: where the server spent this request's time (seconds; `SERVER_TIMING_FIELDS`), or None.
    """

    text: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    behave_logprobs: np.ndarray
    versions: np.ndarray
    timing: dict | None = None

    def __post_init__(self):
        fields = {"input_ids": np.int32, "loss_mask": np.int8, "behave_logprobs": np.float32, "versions": np.int32}
        length = None
        for name, dtype in fields.items():
            value = np.asarray(getattr(self, name))
            if value.ndim != 1:
                raise ValueError(f"Generation.{name} must be 1-D [L], got shape {value.shape}")
            if length is not None and value.shape[0] != length:
                raise ValueError(f"Generation.{name} has length {value.shape[0]}, input_ids has {length}")
            length = value.shape[0]
            object.__setattr__(self, name, value.astype(dtype, copy=False))
        if not isinstance(self.text, str):
            raise TypeError(f"Generation.text must be str, got {type(self.text).__name__}")
        policy = self.loss_mask.astype(bool)
        if np.any(self.versions[~policy] != -1) or np.any(self.versions[policy] < 0):
            raise ValueError("Generation.versions must be -1 exactly on prompt tokens (loss_mask == 0)")

    @property
    def num_policy_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> "Generation":
        missing = {"text", "input_ids", "loss_mask", "behave_logprobs", "versions"} - set(reply)
        if missing:
            raise ValueError(f"policy server reply lacks {sorted(missing)}; its handler must return every "
                             "Generation field")
        timing = reply.get("timing")
        timing = ({k: float(timing[k]) for k in SERVER_TIMING_FIELDS if isinstance(timing.get(k), (int, float))}
                  if isinstance(timing, dict) else None)
        return cls(reply["text"], reply["input_ids"], reply["loss_mask"], reply["behave_logprobs"],
                   reply["versions"], timing)

    def to_reply(self) -> dict[str, Any]:
        return {"text": self.text, "input_ids": self.input_ids, "loss_mask": self.loss_mask,
                "behave_logprobs": self.behave_logprobs, "versions": self.versions}


def generate_request(messages: list[dict], image_refs: Sequence[int], *, max_new_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                     group: tuple[int, int] | None = None) -> dict[str, Any]:
    """The request dict of one generate call (validated). `group`: (worker id, group id) of the episode this step
    belongs to; the server admits a worker's new group only when the trainer can use it (rollout/admission.py)."""
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    refs = np.asarray(list(image_refs), dtype=np.int64).reshape(-1)
    images_in_messages = sum(isinstance(item, dict) and item.get("type") == "image"
                             for m in messages for item in (m.get("content") if isinstance(m.get("content"), list)
                                                            else []))
    if images_in_messages != refs.shape[0]:
        raise ValueError(f"messages hold {images_in_messages} image items but {refs.shape[0]} image_refs were "
                         "given: pass one ref per {'type': 'image'} item, in order")
    if np.any(refs < 0):
        raise ValueError(f"image_refs must be refs from buffer.screenshots.put (>= 0), got {refs.tolist()}")
    request = {"op": GENERATE_OP, "messages": messages, "image_refs": refs, "max_new_tokens": int(max_new_tokens),
               "temperature": float(temperature), "top_p": float(top_p),
               "seed": None if seed is None else int(seed)}
    if group is not None:
        request["worker_id"], request["group_id"] = int(group[0]), int(group[1])
    return request


class PolicyClient:
    """Client of a remote policy server (see module docstring)."""

    def __init__(self, address: str, *, token: str, timeout_s: float = 600.0, server_key: str | None = None):
        """`server_key`: the server's CurveZMQ public key when it encrypts (rollout.curve), else None (PLAIN)."""
        self._transport = TransportClient(address, token=token, timeout_s=timeout_s, server_key=server_key)

    def generate(self, messages: list[dict], image_refs: Sequence[int], *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 group: tuple[int, int] | None = None) -> Generation:
        request = generate_request(messages, image_refs, max_new_tokens=max_new_tokens, temperature=temperature,
                                   top_p=top_p, seed=seed, group=group)
        return Generation.from_reply(self._transport.request(request))

    def close(self) -> None:
        self._transport.close()


class InProcessClient:
    """Calls ``handler(request) -> reply`` in this process, through the same encoding as the wire."""

    def __init__(self, handler: Callable[[dict], dict]):
        self._handler = handler

    def generate(self, messages: list[dict], image_refs: Sequence[int], *, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int | None = None,
                 group: tuple[int, int] | None = None) -> Generation:
        request = generate_request(messages, image_refs, max_new_tokens=max_new_tokens, temperature=temperature,
                                   top_p=top_p, seed=seed, group=group)
        _, wire_request = decode_message(encode_message({}, request))
        _, wire_reply = decode_message(encode_message({}, self._handler(wire_request)))
        return Generation.from_reply(wire_reply)

    def close(self) -> None:
        pass
