"""The agent prompt: goal, older steps as text, the last N (screenshot, response) rounds, and the Memory JSON.

Output is HF chat ``messages`` plus the screenshot refs bound, in order, to its ``{"type": "image"}`` items
(docs/interfaces.md): the policy server applies the chat template and reads the pixels by reference.

    system     how to answer (memory line + one action)
    user       Task: <goal>  [+ earlier steps, summarised]  [image of round 1]  Step 1 ...
    assistant  <response of round 1, think spans stripped>
    ...        (at most ``window`` past rounds, each with its screenshot)
    user       [current image]  Step t of at most M. Memory: {...}  [+ feedback on an invalid action]

Past responses keep their text minus ``<think>…</think>`` spans, so thinking models do not flood the window.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple

from jaxwebrl.env.agent.actions import Action, strip_think
from jaxwebrl.env.agent.memory import format_memory

CALL_STYLE_ACTIONS = (
    "click(x, y) | type(text=\"...\") | key(\"Enter\") | scroll(\"down\") | wait(1) | go_back() | "
    "navigate(\"url\") | answer(\"text\")"
)
TOOL_CALL_ACTIONS = (
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "click", "coordinate": [x, y]}}\n</tool_call>\n'
    "with action one of click (coordinate), type (text, optional coordinate), key (keys list), scroll (direction, "
    "amount), wait (time), go_back, navigate (url), answer (text)"
)
SYSTEM_PROMPT = (
    "You are a web agent. Each turn you see a screenshot of the page and act once. Coordinates are integers "
    "0-1000 over the screenshot (0,0 = top left). Answer with two lines:\n"
    "Memory: a JSON object with what you need to remember\n"
    "Action: {actions}"
)
_STEP_TEXT = re.compile(r"Step (\d+) of at most (\d+)\.")
_SPECIAL_FORM = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """window: past rounds kept with their screenshots (the prompt has up to window + 1 images).
    max_summary_steps: the summary window: the last this-many older steps (those before the screenshot window)
        are listed as one text line each, every older step before them is counted only ("(N earlier steps not
        shown)"); 0 lists none.
    max_summary_chars: each summary line is cut to this many characters.
    action_style: "call" (``click(250, 500)``, short, for tiny policies) or "tool_call" (Qwen3-VL style).
    system_prompt: replaces the default system text when set (``{actions}`` is filled in if present)."""

    window: int = 2
    max_summary_steps: int = 30
    max_summary_chars: int = 120
    action_style: str = "call"
    system_prompt: str | None = None

    def __post_init__(self):
        if self.window < 0:
            raise ValueError(f"PromptConfig.window must be >= 0, got {self.window}")
        if self.max_summary_steps < 0 or self.max_summary_chars < 16:
            raise ValueError("PromptConfig.max_summary_steps must be >= 0 and max_summary_chars >= 16")
        if self.action_style not in ("call", "tool_call"):
            raise ValueError(f"PromptConfig.action_style must be 'call' or 'tool_call', got {self.action_style!r}")

    @property
    def max_images(self) -> int:
        """K, the width of a step row's ``screenshot_refs``."""
        return self.window + 1

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> "PromptConfig":
        values = dict(values or {})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown prompt option(s) {sorted(unknown)}; known: "
                             f"{[f.name for f in dataclasses.fields(cls)]}")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One finished step as the prompt remembers it.

    screenshot_ref: ref of the screenshot the agent saw before acting.
    response: the model's raw text. action_summary: a short text of what was done (``summarize_action``).
    feedback: what the environment said about the action (e.g. why it was invalid), or None.
    """

    screenshot_ref: int
    response: str
    action_summary: str
    feedback: str | None = None


class Prompt(NamedTuple):
    messages: list[dict]
    image_refs: list[int]


def summarize_action(action: Action, max_chars: int = 80) -> str:
    """Short one-line text of an action, e.g. ``click(250, 500)``, ``type("bob")``, ``invalid: <error>``."""
    if not action.is_valid:
        text = f"invalid: {action.error}"
    elif action.kind == "click":
        text = f"click({action.x}, {action.y})" if action.clicks == 1 else f"double_click({action.x}, {action.y})"
    elif action.kind in ("type", "answer", "navigate"):
        at = f", at=({action.x}, {action.y})" if action.has_point else ""
        text = f"{action.kind}({action.text!r}{at})"
    elif action.kind == "key":
        text = f"key({'+'.join(action.keys or ())!r})"
    elif action.kind == "scroll":
        text = f"scroll({action.direction!r}, {action.amount})"
    elif action.kind == "wait":
        text = f"wait({action.seconds:g})"
    else:
        text = f"{action.kind}()"
    return cut_text(text, max_chars)


def build_prompt(
    goal: str,
    history: list[StepRecord],
    screenshot_ref: int,
    memory: dict[str, Any] | None,
    config: PromptConfig,
    *,
    max_steps: int,
) -> Prompt:
    """Messages and image refs for the next step (index ``len(history)``) of an episode.

    history: all finished steps of this episode, oldest first. screenshot_ref: the current screenshot.
    memory: the latest Memory JSON (None or {} before the agent wrote one). max_steps: the horizon, shown.
    """
    step_index = len(history)
    window = history[max(0, step_index - config.window):] if config.window else []
    older = history[:step_index - len(window)]
    actions = CALL_STYLE_ACTIONS if config.action_style == "call" else TOOL_CALL_ACTIONS
    system = (config.system_prompt or SYSTEM_PROMPT).replace("{actions}", actions)

    intro = f"Task: {goal}"
    if older:
        intro += "\n" + _summary(older, config)
    messages: list[dict] = [{"role": "system", "content": [_text(system)]}]
    image_refs: list[int] = []
    pending_text = [intro]  # text that opens the next user message
    for offset, record in enumerate(window):
        index = step_index - len(window) + offset
        messages.append(_user(pending_text, f"Step {index + 1} of at most {max_steps}."))
        image_refs.append(int(record.screenshot_ref))
        messages.append({"role": "assistant", "content": [_text(strip_think(record.response).strip())]})
        pending_text = [f"Feedback: {record.feedback}"] if record.feedback else []
    current = f"Step {step_index + 1} of at most {max_steps}. Memory: {format_memory(memory or {})}"
    if window == [] and history and history[-1].feedback:
        pending_text.append(f"Feedback: {history[-1].feedback}")
    messages.append(_user(pending_text, current))
    image_refs.append(int(screenshot_ref))
    return Prompt(messages, image_refs)


def prompt_excerpt(prompt: Prompt, max_chars: int = 600) -> str:
    """The text of the prompt's last user message (task/feedback, step, memory), cut to `max_chars`: what a
    trajectory viewer shows of the prompt a step was answered from."""
    texts = [item["text"] for item in prompt.messages[-1]["content"] if item.get("type") == "text"]
    return cut_text("\n".join(texts), max_chars)


def read_goal_and_step(messages: list[dict]) -> tuple[str, int]:
    """(goal, 0-based step index) from messages made by ``build_prompt``; for scripted test backends."""
    texts = [item.get("text", "") for m in messages if m.get("role") == "user"
             for item in m.get("content", []) if item.get("type") == "text"]
    goal = next((t[len("Task: "):].split("\n", 1)[0] for t in texts if t.startswith("Task: ")), None)
    steps = [int(m.group(1)) for t in texts for m in _STEP_TEXT.finditer(t)]
    if goal is None or not steps:
        raise ValueError("messages were not built by jaxwebrl.env.agent.prompt.build_prompt (no Task/Step text)")
    return goal, steps[-1] - 1


def _summary(older: list[StepRecord], config: PromptConfig) -> str:
    """The summary window: the last `max_summary_steps` older steps one line each, the ones before counted only."""
    shown = older[max(0, len(older) - config.max_summary_steps):] if config.max_summary_steps else []
    lines = ["Earlier steps:"]
    if len(shown) < len(older):
        lines.append(f"({len(older) - len(shown)} earlier steps not shown)")
    first = len(older) - len(shown)
    for offset, record in enumerate(shown):
        line = f"Step {first + offset + 1}: {record.action_summary}"
        if record.feedback:
            line += f" ({record.feedback})"
        lines.append(cut_text(line, config.max_summary_chars))
    return "\n".join(lines)


def _user(texts_before: list[str], text_after: str) -> dict:
    content = [_text(t) for t in texts_before if t]
    content.append({"type": "image"})
    content.append(_text(text_after))
    return {"role": "user", "content": content}


def _text(text: str) -> dict:
    return {"type": "text", "text": inert(text)}


def inert(text: str) -> str:
    """`text` with every `<|name|>` (the chat template's special-token form) broken by a zero-width joiner, so the
    tokenizer reads it as text: a response, memory, goal or feedback that spells `<|image_pad|>` would otherwise be an
    image placeholder without an image (the server refuses the prompt, the episode is lost), `<|im_end|>` a turn's
    end. The template's own special tokens are outside the text parts and stay special."""
    return _SPECIAL_FORM.sub(lambda m: f"<\u200d|{m.group(1)}|>", text)


def cut_text(text: str, max_chars: int) -> str:
    """`text`, or its first `max_chars` - 3 characters and "..." when it is longer."""
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."
