"""Agent actions in the Qwen3-VL computer-use style, their parser from model text, and the inverse formatters.

(One module past ~400 lines on purpose: it is the action language, and its parser and formatters are exact inverses
that are read, changed and tested together.)

Canonical text (what `format_action` writes and models are prompted to emit):

    <tool_call>
    {"name": "computer_use", "arguments": {"action": "click", "coordinate": [500, 300]}}
    </tool_call>

Coordinates are integers in 0..1000 over the screenshot the agent saw (0 = left/top edge, 1000 = right/bottom
edge); `to_viewport` maps them to CSS pixels. Actions and their arguments:

    click       coordinate=[x, y], clicks=1|2 (2 = double click)
    type        text="...", optional coordinate=[x, y] (clicked first)
    key         keys=["ctrl", "a"] (pressed together) or keys=["Enter"]
    scroll      direction="up"|"down"|"left"|"right", amount=pixels, optional coordinate=[x, y]
    wait        time=seconds
    go_back     (no arguments)
    navigate    url="..."
    answer      text="..." (ends the episode with this answer)

The parser also accepts Qwen's names (left_click, double_click, terminate, hscroll, scroll with signed `pixels`),
a bare JSON object, and a function-call form such as `click(500, 300)` or `type(text="hi")`. `<think>...</think>`
spans are ignored. Malformed text never raises: it becomes `Action(kind="invalid", error=...)`, and the
error says what was wrong so it can be fed back to the model.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from typing import Any

ACTION_KINDS = ("click", "type", "key", "scroll", "wait", "go_back", "navigate", "answer")
INVALID = "invalid"
COORD_MAX = 1000
SCROLL_DIRECTIONS = ("up", "down", "left", "right")
DEFAULT_SCROLL_PIXELS = 300
MAX_WAIT_SECONDS = 10.0

# Qwen computer-use names and other common spellings -> (our kind, extra fields).
_ALIASES = {
    "click": ("click", {}),
    "left_click": ("click", {}),
    "tap": ("click", {}),
    "double_click": ("click", {"clicks": 2}),
    "type": ("type", {}),
    "input": ("type", {}),
    "type_text": ("type", {}),
    "key": ("key", {}),
    "press": ("key", {}),
    "keypress": ("key", {}),
    "hotkey": ("key", {}),
    "scroll": ("scroll", {}),
    "hscroll": ("scroll", {"_horizontal": True}),
    "wait": ("wait", {}),
    "go_back": ("go_back", {}),
    "back": ("go_back", {}),
    "navigate": ("navigate", {}),
    "goto": ("navigate", {}),
    "open_url": ("navigate", {}),
    "answer": ("answer", {}),
    "terminate": ("answer", {"_from_terminate": True}),
    "stop": ("answer", {}),
}

_THINK_TAG = re.compile(r"<(/?)think>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"</think>", re.IGNORECASE)
_OPEN_THINK = re.compile(r"<think>", re.IGNORECASE)
MAX_JSON_NESTING = 16  # a `{` deeper than this inside other braces is never tried as the action object
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL | re.IGNORECASE)
_FUNC_CALL = re.compile(r"\b(" + "|".join(sorted(_ALIASES, key=len, reverse=True)) + r")\s*\(", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Action:
    """One agent action. Fields not used by `kind` stay None.

    kind: one of ACTION_KINDS, or "invalid" (then `error` says why).
    x, y: int coordinates in 0..1000 (click, optional for type/scroll).
    text: typed text (type), answer text (answer), URL (navigate).
    keys: key names pressed together (key), e.g. ("ctrl", "a").
    direction, amount: scroll direction and pixels (scroll).
    seconds: wait time (wait). clicks: 1 or 2 (click).
    raw: the model text this action was parsed from ("" when built in code).
    """

    kind: str
    x: int | None = None
    y: int | None = None
    text: str | None = None
    keys: tuple[str, ...] | None = None
    direction: str | None = None
    amount: int | None = None
    seconds: float | None = None
    clicks: int = 1
    error: str | None = None
    raw: str = dataclasses.field(default="", compare=False)

    @property
    def is_valid(self) -> bool:
        return self.kind != INVALID

    @property
    def has_point(self) -> bool:
        return self.x is not None and self.y is not None


def invalid(error: str, raw: str = "") -> Action:
    return Action(kind=INVALID, error=error, raw=raw)


def strip_think(text: str) -> str:
    """Remove `<think>...</think>` spans (each from a `<think>` to the next `</think>`); text before a dangling
    `</think>` is thinking too, and so is everything after an unclosed `<think>`. One pass over the tags: linear
    in len(text) however many tags there are."""
    kept, position, opened = [], 0, None
    for tag in _THINK_TAG.finditer(text):
        closing = bool(tag.group(1))
        if opened is None and not closing:
            opened = tag.start()
        elif opened is not None and closing:
            kept.append(text[position:opened])
            position, opened = tag.end(), None
    kept.append(text[position:])
    text = "".join(kept)
    last_close = None
    for last_close in _CLOSE_THINK.finditer(text):
        pass
    if last_close is not None:
        return text[last_close.end():]
    first_open = _OPEN_THINK.search(text)  # unfinished thinking: nothing after it is an action
    return text[: first_open.start()] if first_open else text


def parse_action(text: str) -> Action:
    """Parse model output into an Action. Never raises; malformed output -> kind "invalid" with an error."""
    if not isinstance(text, str):
        return invalid(f"model output must be text, got {type(text).__name__}")
    raw = text
    try:
        body = strip_think(text).strip()
        if not body:
            return invalid("empty output: emit one action as <tool_call>{...}</tool_call>", raw)
        match = _TOOL_CALL.search(body)
        if match:
            payload = _first_json_object(match.group(1))
            if payload is None:
                return invalid("<tool_call> does not contain a JSON object", raw)
            return _from_json(payload, raw)
        found, call = _first_json_span(body), _FUNC_CALL.search(body)
        if call and found is not None and call.start() < found[1]:   # a JSON object inside the call's own text
            end = _matching_paren(body, call.end() - 1)                # (`type(text="{}")`) is an argument
            if end is None or found[1] < end:
                found = None
        if found is not None:
            return _from_json(found[0], raw)
        if call:
            return _from_function_call(body, call, raw)
        return invalid("no action found: emit one action as <tool_call>{...}</tool_call>", raw)
    except Exception as exc:  # the parser's promise: model text never crashes a worker
        return invalid(f"unparseable action ({type(exc).__name__}: {exc})", raw)


def _first_json_object(text: str) -> dict | None:
    """The first balanced `{...}` in text (by where it starts) that decodes to a JSON object, or None."""
    found = _first_json_span(text)
    return None if found is None else found[0]


def _first_json_span(text: str) -> tuple[dict, int] | None:
    """(object, where it starts) of the first balanced `{...}` in text that decodes to a JSON object, or None.

    Linear in len(text): two passes pair the braces (one skipping braces inside JSON strings, one counting every
    brace, so neither a `}` inside a typed text nor a stray quote in prose hides the object), then only balanced
    spans nested at most MAX_JSON_NESTING deep are decoded: each character is decoded a bounded number of times.
    (Decoding from every `{` to the end of the text was quadratic: `"{" * 200000` took seconds.)"""
    spans = sorted(set(_brace_spans(text, strings=True)) | set(_brace_spans(text, strings=False)))
    for start, end in spans:
        value = _decode_json(text[start:end])
        if isinstance(value, dict):
            return value, start
    return None


def _brace_spans(text: str, strings: bool) -> list[tuple[int, int]]:
    """(start, end) of every balanced `{...}` nested at most MAX_JSON_NESTING deep (in closing order).

    strings: skip braces inside JSON strings; quotes count only inside braces (prose before a JSON object may
    hold quotes), and a `\\` escapes the character right after it."""
    spans: list[tuple[int, int]] = []
    stack: list[int] = []
    in_string, escaped_at = False, -1
    for match in (_BRACE_OR_STRING if strings else _BRACE).finditer(text):
        token, at = match.group(), match.start()
        if in_string:
            if at == escaped_at:
                continue
            if token == "\\":
                escaped_at = at + 1
            elif token == '"':
                in_string = False
        elif token == "{":
            stack.append(at)
        elif token == "}":
            if stack:
                start = stack.pop()
                if len(stack) < MAX_JSON_NESTING:
                    spans.append((start, at + 1))
        elif token == '"' and stack:
            in_string = True
    return spans


_BRACE_OR_STRING = re.compile(r'[{}"\\]')
_BRACE = re.compile(r"[{}]")


def _decode_json(span: str) -> Any:
    """json.loads of one candidate span; None when it is not JSON."""
    try:
        return json.loads(span)
    except (ValueError, RecursionError):
        return None


def _from_json(payload: dict, raw: str) -> Action:
    args = payload.get("arguments", payload.get("args", payload.get("parameters")))
    if isinstance(args, str):  # some templates double-encode the arguments
        decoded = _first_json_object(args)
        args = decoded if decoded is not None else {}
    if isinstance(args, dict) and "action" in args:
        name, fields = args["action"], {k: v for k, v in args.items() if k != "action"}
    elif "action" in payload:
        name, fields = payload["action"], {k: v for k, v in payload.items() if k not in ("action", "name")}
    elif isinstance(args, dict) and isinstance(payload.get("name"), str):
        name, fields = payload["name"], args
    else:
        return invalid('JSON has no "action": use {"name": "computer_use", "arguments": {"action": ...}}', raw)
    return _build(name, fields, raw)


def _from_function_call(body: str, call: re.Match, raw: str) -> Action:
    end = _matching_paren(body, call.end() - 1)
    if end is None:
        return invalid(f"unbalanced parentheses in {call.group(1)}(...)", raw)
    src = body[call.start(): end + 1]
    try:
        node = ast.parse(src.strip(), mode="eval").body
    except SyntaxError as exc:
        return invalid(f"cannot parse {src!r}: {exc.msg}", raw)
    if not isinstance(node, ast.Call):
        return invalid(f"{src!r} is not a call", raw)
    try:
        positional = [ast.literal_eval(a) for a in node.args]
        keywords = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    except ValueError:
        return invalid(f"arguments of {src!r} must be literals (numbers, strings, lists)", raw)
    kind = _ALIASES[call.group(1).lower()][0]
    fields = dict(keywords)
    if positional:
        if kind in ("click",) or (kind in ("type", "scroll") and _is_number(positional[0])):
            if len(positional) >= 2 and _is_number(positional[0]):
                fields.setdefault("coordinate", positional[:2])
                positional = positional[2:]
            elif isinstance(positional[0], (list, tuple)):
                fields.setdefault("coordinate", positional[0])
                positional = positional[1:]
        slot = {"type": "text", "answer": "text", "navigate": "url", "key": "keys", "scroll": "direction",
                "wait": "time", "click": None, "go_back": None}[kind]
        if positional and slot:   # key("ctrl", "a"): every positional is a key
            fields.setdefault(slot, positional[0] if slot != "keys" or len(positional) == 1 else positional)
            positional = [] if slot == "keys" else positional[1:]
        if kind == "scroll" and positional:
            fields.setdefault("amount", positional[0])
            positional = positional[1:]
        if positional:
            return invalid(f"too many arguments in {src!r}", raw)
    return _build(call.group(1), fields, raw)


def _matching_paren(text: str, open_index: int) -> int | None:
    depth, quote, escaped = 0, None, False
    for i in range(open_index, len(text)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not _is_number(value) or not math.isfinite(value):
        return None
    return float(value)


def _point(fields: dict, required: bool) -> tuple[int | None, int | None, str | None]:
    coord = fields.get("coordinate", fields.get("coordinates", fields.get("point")))
    if coord is None and "x" in fields and "y" in fields:
        coord = [fields["x"], fields["y"]]
    if coord is None:
        return None, None, ("needs coordinate=[x, y] with x, y in 0..1000" if required else None)
    if isinstance(coord, str):
        coord = re.findall(r"-?\d+(?:\.\d+)?", coord)
    if not isinstance(coord, (list, tuple)) or len(coord) != 2:
        return None, None, f"coordinate must be [x, y], got {coord!r}"
    x, y = _number(coord[0]), _number(coord[1])
    if x is None or y is None:
        return None, None, f"coordinate must hold two numbers, got {coord!r}"
    if not (0 <= x <= COORD_MAX and 0 <= y <= COORD_MAX):
        return None, None, f"coordinate {coord!r} is outside 0..{COORD_MAX}"
    return int(round(x)), int(round(y)), None


def _text(fields: dict, *names: str) -> str | None:
    for name in names:
        value = fields.get(name)
        if isinstance(value, str):
            return value
        if _is_number(value):
            return str(value)
    return None


def _build(name: Any, fields: dict, raw: str) -> Action:
    if not isinstance(name, str) or name.strip().lower() not in _ALIASES:
        return invalid(f"unknown action {name!r}: use one of {', '.join(ACTION_KINDS)}", raw)
    kind, extra = _ALIASES[name.strip().lower()]
    fields = {**fields, **extra}

    if kind == "click":
        x, y, err = _point(fields, required=True)
        if err:
            return invalid(f"click {err}", raw)
        clicks = int(fields.get("clicks", 1)) if _is_number(fields.get("clicks", 1)) else 1
        return Action("click", x=x, y=y, clicks=2 if clicks >= 2 else 1, raw=raw)
    if kind == "type":
        text = _text(fields, "text", "content", "value")
        if text is None:
            return invalid('type needs text="..."', raw)
        x, y, err = _point(fields, required=False)
        if err:
            return invalid(f"type {err}", raw)
        return Action("type", x=x, y=y, text=text, raw=raw)
    if kind == "key":
        keys = fields.get("keys", fields.get("key", fields.get("text")))
        if isinstance(keys, str):
            keys = [k for k in re.split(r"\s*\+\s*", keys.strip()) if k] if keys.strip() != "+" else ["+"]
        if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) and k for k in keys):
            return invalid('key needs keys=["Enter"] or keys=["ctrl", "a"]', raw)
        return Action("key", keys=tuple(keys), raw=raw)
    if kind == "scroll":
        return _build_scroll(fields, raw)
    if kind == "wait":
        seconds = _number(fields.get("time", fields.get("seconds", 1.0)))
        if seconds is None or seconds < 0:
            return invalid("wait needs time=<seconds> >= 0", raw)
        return Action("wait", seconds=min(seconds, MAX_WAIT_SECONDS), raw=raw)
    if kind == "go_back":
        return Action("go_back", raw=raw)
    if kind == "navigate":
        url = _text(fields, "url", "text", "href")
        if not url or not url.strip():
            return invalid('navigate needs url="..."', raw)
        return Action("navigate", text=url.strip(), raw=raw)
    # answer (and terminate, whose `status` is the answer when no text is given)
    text = _text(fields, "text", "answer", "content", "status" if extra.get("_from_terminate") else "text")
    return Action("answer", text=text if text is not None else "", raw=raw)


def _build_scroll(fields: dict, raw: str) -> Action:
    x, y, err = _point(fields, required=False)
    if err:
        return invalid(f"scroll {err}", raw)
    direction = fields.get("direction")
    amount = _number(fields.get("amount", fields.get("pixels_abs")))
    if direction is None and "pixels" in fields:
        pixels = _number(fields["pixels"])
        if pixels is None or pixels == 0:
            return invalid("scroll pixels must be a non-zero number", raw)
        if fields.get("_horizontal"):
            direction = "right" if pixels > 0 else "left"
        else:  # Qwen convention: positive pixels scroll up
            direction = "up" if pixels > 0 else "down"
        amount = abs(pixels)
    if not isinstance(direction, str) or direction.strip().lower() not in SCROLL_DIRECTIONS:
        return invalid(f"scroll needs direction in {SCROLL_DIRECTIONS}, got {direction!r}", raw)
    if amount is None:
        amount = DEFAULT_SCROLL_PIXELS
    if amount <= 0:
        return invalid("scroll amount must be positive pixels", raw)
    return Action("scroll", x=x, y=y, direction=direction.strip().lower(), amount=int(round(amount)), raw=raw)


def format_action(action: Action) -> str:
    """The canonical tool-call text for an action; `parse_action(format_action(a)) == a` for valid actions."""
    if not action.is_valid:
        raise ValueError(f"cannot format an invalid action ({action.error})")
    args: dict[str, Any] = {"action": action.kind}
    if action.kind == "click":
        args["coordinate"] = [action.x, action.y]
        if action.clicks == 2:
            args["clicks"] = 2
    elif action.kind == "type":
        if action.has_point:
            args["coordinate"] = [action.x, action.y]
        args["text"] = action.text
    elif action.kind == "key":
        args["keys"] = list(action.keys or ())
    elif action.kind == "scroll":
        if action.has_point:
            args["coordinate"] = [action.x, action.y]
        args["direction"] = action.direction
        args["amount"] = action.amount
    elif action.kind == "wait":
        args["time"] = action.seconds
    elif action.kind == "navigate":
        args["url"] = action.text
    elif action.kind == "answer":
        args["text"] = action.text
    body = json.dumps({"name": "computer_use", "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def format_call(action: Action) -> str:
    """The short call-style text of an action (`click(250, 500)`, `type(text="abc")`, `key("Enter")`,
    `answer("4.20")`), what the
    "call" action style prompts for; the canonical tool call (`format_action`) where there is no shorter form.
    `parse_action` reads both."""
    if action.kind == "click" and action.clicks == 1:
        return f"click({action.x}, {action.y})"
    if action.kind == "type" and not action.has_point:
        return f"type(text={json.dumps(action.text, ensure_ascii=False)})"
    if action.kind == "key":
        return f"key({', '.join(json.dumps(k) for k in action.keys or ())})"
    if action.kind == "answer":
        return f"answer({json.dumps(action.text, ensure_ascii=False)})"
    return format_action(action)


def to_viewport(x: int, y: int, width: int, height: int) -> tuple[float, float]:
    """Map 0..1000 coordinates onto a width x height viewport, in CSS pixels (float, inside the viewport)."""
    px = min(max(x / COORD_MAX * width, 0.0), width - 1.0)
    py = min(max(y / COORD_MAX * height, 0.0), height - 1.0)
    return px, py


def from_viewport(px: float, py: float, width: int, height: int) -> tuple[int, int]:
    """Inverse of `to_viewport` for oracles: CSS pixels -> 0..1000 integer coordinates."""
    x = int(round(min(max(px / width, 0.0), 1.0) * COORD_MAX))
    y = int(round(min(max(py / height, 0.0), 1.0) * COORD_MAX))
    return x, y
