"""The agent's Memory JSON: parsed from each response, carried forward, and measured.

The agent writes a line ``Memory: {...}`` (a JSON object) in every response; the worker parses it and puts
the latest one back into the next prompt. Each step records three numbers, the paper's memory-bloat
diagnostic: the memory's size in characters, its key count, and the fraction of keys that are generic
placeholders (``info``, ``notes_2``, ``additional_details``, ``step_7`` ...) rather than task content.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from jaxwebrl.env.agent.actions import strip_think

MEMORY_LABEL = re.compile(r"memory\s*:", re.IGNORECASE)

# Words that name no task content. A key is generic when every word in it is one of these (numbers ignored).
GENERIC_KEY_WORDS = frozenset(
    """
    info information note notes data detail details misc miscellaneous other others extra additional general
    item items entry entries field fields key keys value values slot slots placeholder placeholders temp tmp
    stuff thing things content contents context summary observation observations status state record records
    unknown todo remark remarks comment comments memo memos log logs step steps new more any some
    """.split()
)

_WORD_SPLIT = re.compile(r"[^0-9a-zA-Z]+|(?<=[a-z])(?=[A-Z])")


def split_memory(response: str) -> tuple[dict[str, Any] | None, str]:
    """(memory, rest): the JSON object after the last ``Memory:`` label of the think-stripped response, and
    that text with the ``Memory: {...}`` span cut out (what the action parser should read).

    memory is None when there is no label, the JSON is malformed, or it is not an object; rest is then the
    whole think-stripped text.
    """
    text = strip_think(response).strip()
    decoder = json.JSONDecoder()
    for label in reversed(list(MEMORY_LABEL.finditer(text))):
        start = text.find("{", label.end())
        if start == -1 or text[label.end():start].strip():
            continue
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value, (text[:label.start()] + text[end:]).strip()
    return None, text


def parse_memory(response: str) -> dict[str, Any] | None:
    """The memory a response writes (see ``split_memory``), or None."""
    return split_memory(response)[0]


def format_memory(memory: dict[str, Any]) -> str:
    """Compact, key-order-preserving JSON text of a memory, as it appears in prompts."""
    return json.dumps(memory, ensure_ascii=False, separators=(", ", ": "))


def is_generic_key(key: str) -> bool:
    """True when a key names no task content: all its words are placeholders or numbers."""
    words = [w.lower() for w in _WORD_SPLIT.split(str(key)) if w]
    words = [w for w in words if not w.isdigit()]
    words = [w.rstrip("0123456789") for w in words]
    words = [w for w in words if w]
    return not words or all(w in GENERIC_KEY_WORDS for w in words)


def _all_keys(value: Any) -> list[str]:
    keys: list[str] = []
    if isinstance(value, dict):
        for key, child in value.items():
            keys.append(str(key))
            keys.extend(_all_keys(child))
    elif isinstance(value, list):
        for child in value:
            keys.extend(_all_keys(child))
    return keys


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Per-step memory diagnostic: ``chars`` of the compact JSON, ``keys`` at every nesting level,
    ``generic_frac`` = generic keys / keys (0.0 for an empty memory)."""

    chars: int
    keys: int
    generic_frac: float


def memory_stats(memory: dict[str, Any] | None) -> MemoryStats:
    """Size, key count and generic-key fraction of a memory (None or {} -> all zeros)."""
    if not memory:
        return MemoryStats(chars=0, keys=0, generic_frac=0.0)
    keys = _all_keys(memory)
    generic = sum(is_generic_key(k) for k in keys)
    return MemoryStats(chars=len(format_memory(memory)), keys=len(keys), generic_frac=generic / len(keys))


class MemoryTracker:
    """Carries the agent's memory across the steps of one episode.

    ``update(response)`` replaces the memory with the one the response writes; a response without a
    parseable memory keeps the previous one (and counts as ``missing``).
    """

    def __init__(self) -> None:
        self.memory: dict[str, Any] = {}
        self.missing = 0

    def update(self, response: str) -> MemoryStats:
        parsed = parse_memory(response)
        if parsed is None:
            self.missing += 1
        else:
            self.memory = parsed
        return memory_stats(self.memory)
