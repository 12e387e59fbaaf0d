"""The action grammar: what a policy decoding under it may say, and how a response is laid out.

A policy that has never seen the action grammar (the tiny default) decodes under a token automaton that admits
exactly `RESPONSE_PREFIX + text` + the end token for each action text of its tasks. The texts are passed in:
each task family gives its own (`jaxwebrl.env.registry.action_texts`: the toy's two button presses; for a
browser page the centres of a 10 × 10 grid of the 0-1000 coordinate space, `CLICK_GRID`, or of the finer grid
its task declares, `click_grid`: 20 × 20 for click-checkboxes-large and choose-date, whose small targets the
10 × 10 grid misses); this module knows no task. The policy is the model restricted to the grammar: the policy server samples under it and
records log-probs under it; the trainer replays the automaton over the sampled tokens to recompute the same
restricted log-probs, and takes the loss where the grammar left a choice (the forced tokens — ~33 of the 35 of a
toy response — have log-prob 0 and would only dilute the token mean of the one that matters).

    texts = registry.config_action_texts(config)   # None when model.constrained_actions is off
    responses = response_texts(texts)        # "Memory: {}\\nAction: click(250, 500)", ...

The memory section is `Memory: {}` (env.memory "empty", the minimal memory the paper favours), or, with
env.memory "free", a bounded free-form JSON object the policy writes every step (`MemoryGrammar`): up to
`max_keys` entries `"key": "value"`, keys from a fixed list of content words (`MEMORY_CONTENT_WORDS`) and of
generic words (`MEMORY_GENERIC_WORDS`, the placeholders `env.agent.memory` counts as generic), each optionally
numbered (`notes_2`), values of 1..`value_chars` lowercase letters or digits. So the memory's size and its
generic-key share can grow or shrink under RL (the paper's memory-bloat finding), and the grammar is a regular
language (`response_regex`) that `TokenConstraint.from_regex` compiles for a tokenizer.

    memory = config_memory_grammar(config)   # None: "Memory: {}"
    pattern = response_regex(texts, memory)  # 'Memory: \\{(...)?\\}\\nAction: (click\\(50, 50\\)|...)'

The token side (the automaton over a tokenizer's ids, its replay over step rows) is
`jaxwebrl.models.constraints.TokenConstraint` (`from_texts`, `from_regex`, `replay`, `decision_mask`).
"""

from __future__ import annotations

import dataclasses
import re

from jaxwebrl.env.agent.memory import GENERIC_KEY_WORDS, format_memory


def click_grid(columns: int, rows: int) -> tuple[str, ...]:
    """The clicks at the cell centres of a columns × rows grid over the 0-1000 space, row by row."""
    if not (1 <= columns <= 1000 and 1 <= rows <= 1000):
        raise ValueError(f"click grid {columns} x {rows}: each side must be in 1..1000")
    return tuple(f"click({(2 * i + 1) * 1000 // (2 * columns)}, {(2 * j + 1) * 1000 // (2 * rows)})"
                 for j in range(rows) for i in range(columns))


CLICK_GRID = click_grid(10, 10)   # a 100-unit grid: click(50, 50) ... click(950, 950)
MEMORY_LABEL = "Memory: "
ACTION_LABEL = "\nAction: "
RESPONSE_PREFIX = MEMORY_LABEL + "{}" + ACTION_LABEL
# The free memory's key words: task content (progress, targets, what was seen) and generic placeholders.
MEMORY_CONTENT_WORDS = ("done", "next", "pressed", "goal", "target", "colour", "count", "page", "last", "left")
MEMORY_GENERIC_WORDS = ("info", "notes", "data", "status", "step", "extra", "misc", "details")
_MAX_KEY_SUFFIX = 9   # a key may be numbered: notes_1 .. notes_9


@dataclasses.dataclass(frozen=True)
class MemoryGrammar:
    """The bounded free-form memory (see the module docstring): at most `max_keys` entries, values of
    1..`value_chars` characters of [a-z0-9]."""

    max_keys: int = 3
    value_chars: int = 6

    def __post_init__(self):
        if not 1 <= self.max_keys <= 8 or not 1 <= self.value_chars <= 16:
            raise ValueError(f"memory grammar: max_keys {self.max_keys} must be in 1..8 and value_chars "
                             f"{self.value_chars} in 1..16")

    def regex(self) -> str:
        """The memory object's pattern, `{}` included (Python `re` syntax, as `format_memory` writes it)."""
        words = "|".join(MEMORY_CONTENT_WORDS + MEMORY_GENERIC_WORDS)
        entry = f'"({words})(_[1-{_MAX_KEY_SUFFIX}])?": "[a-z0-9]{{1,{self.value_chars}}}"'
        return r"\{" + f"({entry}(, {entry}){{0,{self.max_keys - 1}}})?" + r"\}"

    def admits(self, memory: dict) -> bool:
        """True when the grammar can write this memory (the text `format_memory` gives matches `regex`)."""
        return re.fullmatch(self.regex(), format_memory(memory)) is not None

    @property
    def max_chars(self) -> int:
        """The longest memory text the grammar admits (its bound on the prompt's memory line)."""
        key = max(map(len, MEMORY_CONTENT_WORDS + MEMORY_GENERIC_WORDS)) + 2          # notes_9
        entry = 1 + key + 4 + self.value_chars + 1                                      # "key": "value"
        return 2 + self.max_keys * entry + 2 * (self.max_keys - 1)


assert set(MEMORY_GENERIC_WORDS) <= GENERIC_KEY_WORDS and not set(MEMORY_CONTENT_WORDS) & GENERIC_KEY_WORDS


def config_memory_grammar(config) -> MemoryGrammar | None:
    """The run's free memory grammar (`env.memory` "free"), or None for `Memory: {}` ("empty")."""
    e = config.env
    if e.memory == "empty":
        return None
    return MemoryGrammar(max_keys=int(e.memory_max_keys), value_chars=int(e.memory_value_chars))


def response_texts(texts) -> list[str]:
    """The whole response a constrained policy emits for each action text (the end token follows)."""
    return [RESPONSE_PREFIX + text for text in texts]


def response_regex(texts, memory: MemoryGrammar | None = None) -> str:
    """The responses a constrained policy may emit, as one regex (Python `re` syntax, which vLLM's structured
    outputs take too): the memory object (`{}` when `memory` is None), then one of the action texts."""
    actions = "|".join(re.escape(t) for t in texts)
    section = r"\{\}" if memory is None else memory.regex()
    return re.escape(MEMORY_LABEL) + section + re.escape(ACTION_LABEL) + f"({actions})"


def response_text(action_text: str, memory: dict | None = None) -> str:
    """One response in the grammar's layout: the memory object (`{}` when None), then the action text."""
    return MEMORY_LABEL + format_memory(memory or {}) + ACTION_LABEL + action_text
