"""Action parser: canonical round trip, Qwen aliases, function-call form, and malformed model text."""

import re
import time

import pytest
from hypothesis import given, settings, strategies as st

from jaxwebrl.env.agent.actions import (
    Action,
    format_action,
    format_call,
    from_viewport,
    parse_action,
    strip_think,
    to_viewport,
)

VALID = [
    Action("click", x=500, y=300),
    Action("click", x=0, y=1000, clicks=2),
    Action("type", text='he said "hi"\n'),
    Action("type", x=10, y=20, text="ünïcode"),
    Action("key", keys=("ctrl", "a")),
    Action("key", keys=("Enter",)),
    Action("scroll", direction="down", amount=300),
    Action("scroll", x=400, y=400, direction="left", amount=120),
    Action("wait", seconds=1.5),
    Action("go_back"),
    Action("navigate", text="http://127.0.0.1:8000/page.html"),
    Action("answer", text="42"),
]


@pytest.mark.parametrize("action", VALID, ids=lambda a: a.kind)
def test_format_then_parse_round_trips(action):
    text = format_action(action)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert parse_action(text) == action


BRACED = [Action("type", text="{}"), Action("answer", text='set it to {} or {"a": 1}')]


@pytest.mark.parametrize("action", VALID + BRACED, ids=lambda a: a.kind)
def test_call_text_then_parse_round_trips(action):
    """What the "call" action style prompts for and demonstrations write: `key("ctrl", "a")` was refused as
    "too many arguments", and `type(text="{}")` as a JSON object without "action" (the `{}` in its text)."""
    assert parse_action(format_call(action)) == action


@pytest.mark.parametrize(
    "text, expected",
    [
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [12, 34]}}'
         "</tool_call>", Action("click", x=12, y=34)),
        ('{"action": "double_click", "coordinate": [1, 2]}', Action("click", x=1, y=2, clicks=2)),
        ('{"name": "computer_use", "arguments": {"action": "scroll", "pixels": -200}}',
         Action("scroll", direction="down", amount=200)),
        ('{"name": "computer_use", "arguments": {"action": "hscroll", "pixels": 50}}',
         Action("scroll", direction="right", amount=50)),
        ('{"name": "computer_use", "arguments": {"action": "terminate", "status": "success"}}',
         Action("answer", text="success")),
        ('{"name": "computer_use", "arguments": "{\\"action\\": \\"key\\", \\"keys\\": \\"ctrl+c\\"}"}',
         Action("key", keys=("ctrl", "c"))),
        ('{"name": "click", "arguments": {"x": 5.6, "y": "7"}}', Action("click", x=6, y=7)),
        ("Action: click(500, 300)", Action("click", x=500, y=300)),
        ("click(x=1, y=2)", Action("click", x=1, y=2)),
        ('type("hello, (world)")', Action("type", text="hello, (world)")),
        ('key("Enter")', Action("key", keys=("Enter",))),
        ("scroll('up', 100)", Action("scroll", direction="up", amount=100)),
        ("go_back()", Action("go_back")),
        ("wait()", Action("wait", seconds=1.0)),
        ("wait(time=99)", Action("wait", seconds=10.0)),
        ('answer("blue")', Action("answer", text="blue")),
        ("<think>maybe click(1, 1)?</think>\nclick(900, 900)", Action("click", x=900, y=900)),
        ("reasoning that ended </think> go_back()", Action("go_back")),
        ('<tool_call>\n{"name": "computer_use", "arguments": {"action": "click", "coordinate": [3, 4]}}',
         Action("click", x=3, y=4)),  # the closing tag was cut by max_new_tokens
    ],
)
def test_parses_accepted_spellings(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("I think the answer is obvious.", "no action"),
        ("<think>click(1, 2)", "empty"),  # thinking never finished
        ("<tool_call>not json</tool_call>", "JSON"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "fly"}}</tool_call>', "unknown action"),
        ('{"foo": 1}', "no \"action\""),
        ('{"action": "click"}', "coordinate"),
        ('{"action": "click", "coordinate": [1001, 5]}', "outside"),
        ('{"action": "click", "coordinate": [-1, 5]}', "outside"),
        ('{"action": "click", "coordinate": [1, 2, 3]}', "[x, y]"),
        ('{"action": "click", "coordinate": ["a", "b"]}', "two numbers"),
        ('{"action": "click", "coordinate": [NaN, 1]}', "two numbers"),
        ('{"action": "type"}', "text"),
        ('{"action": "key", "keys": []}', "keys"),
        ('{"action": "key", "keys": [1, 2]}', "keys"),
        ('{"action": "scroll", "direction": "sideways"}', "direction"),
        ('{"action": "scroll", "pixels": 0}', "non-zero"),
        ('{"action": "wait", "time": -3}', "time"),
        ('{"action": "navigate"}', "url"),
        ("click(1, 2", "unbalanced"),
        ("click(__import__('os').system('true'), 2)", "literals"),
        ("click(1, 2, 3, 4)", "too many"),
        ("type(text=)", "cannot parse"),
    ],
)
def test_malformed_text_becomes_invalid_with_reason(text, fragment):
    action = parse_action(text)
    assert action.kind == "invalid" and not action.is_valid
    assert fragment.lower() in action.error.lower(), action.error
    assert action.raw == text


def test_non_text_and_invalid_formatting():
    assert parse_action(None).kind == "invalid"
    with pytest.raises(ValueError, match="invalid"):
        format_action(parse_action("nonsense"))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parser_never_raises(text):
    action = parse_action(text)
    assert action.kind in ("invalid", "click", "type", "key", "scroll", "wait", "go_back", "navigate", "answer")
    assert (action.error is not None) == (action.kind == "invalid")


def test_strip_think():
    assert strip_think("<think>a</think>b<think>c</think>d") == "bd"
    assert strip_think("x</think>y") == "y"


def test_viewport_mapping_stays_inside_and_inverts():
    assert to_viewport(0, 0, 160, 210) == (0.0, 0.0)
    assert to_viewport(1000, 1000, 160, 210) == (159.0, 209.0)
    px, py = to_viewport(500, 250, 160, 210)
    assert (px, py) == (80.0, 52.5)
    assert from_viewport(px, py, 160, 210) == (500, 250)


# ---------------------------------------------------------------------------------------------------------------
# Linear parsing: the issue's inputs ("<think>" x 20,000 took 9.9 s, "{" x 200,000 took 6.1 s) and friends.

def _json_work(monkeypatch, text: str) -> int:
    """Characters handed to the JSON decoder while parsing `text` (old and new parsers both go through
    JSONDecoder.raw_decode; decoding from every `{` to the end of the text made this quadratic)."""
    import json

    work = [0]
    raw_decode = json.JSONDecoder.raw_decode

    def counting(self, s, idx=0):
        work[0] += len(s) - idx
        return raw_decode(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    parse_action(text)
    monkeypatch.setattr(json.JSONDecoder, "raw_decode", raw_decode)
    return work[0]


@pytest.mark.parametrize("unit", ["{", '{"a":1,', '{"', '{"a":', 'x "{ ', "{}" + "{" * 3, '{"a": "}",'])
def test_json_search_work_is_linear_in_the_text(monkeypatch, unit):
    n = 20_000 // len(unit)
    small, large = _json_work(monkeypatch, unit * n), _json_work(monkeypatch, unit * 2 * n)
    assert large <= 40 * len(unit) * 2 * n  # a bounded number of decodes per character
    assert large <= 2.5 * max(small, 1)      # doubling the input about doubles the work (quadratic: 4x)


def test_the_issues_inputs_parse_to_a_named_invalid_action():
    assert parse_action("<think>" * 20_000).error.startswith("empty output")
    assert parse_action("{" * 200_000).error.startswith("no action found")
    text = "<think>" * 20_000 + "</think>" + format_action(Action("click", x=1, y=2))
    assert parse_action(text) == Action("click", x=1, y=2)
    start = time.thread_time()  # a smoke check on CPU time, 20x bigger than it needs (old parser: ~40 s)
    parse_action("<think>" * 40_000)
    parse_action("{" * 400_000)
    assert time.thread_time() - start < 5.0


def _strip_think_reference(text: str) -> str:
    """The old, quadratic strip_think (regex with a lazy .*? from every <think>): the behaviour to keep."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL | re.IGNORECASE)
    lower = text.lower()
    if "</think>" in lower:
        text = text[lower.rindex("</think>") + len("</think>"):]
    elif "<think>" in lower:
        text = text[: lower.index("<think>")]
    return text


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "<THINK>", "</Think>", "a", " ", "<thi", "nk>", "{}"]),
                max_size=12).map("".join))
def test_strip_think_keeps_the_old_behaviour(text):
    assert strip_think(text) == _strip_think_reference(text)


@pytest.mark.parametrize("text, expected", [
    ('<tool_call>{"name": "computer_use", "arguments": {"action": "type", "text": "a}b"}}</tool_call>',
     Action("type", text="a}b")),
    ('use { a "quote, then {"action": "click", "coordinate": [1, 2]}', Action("click", x=1, y=2)),
    ('{"name": "computer_use", "arguments": {"action": "click", "coordinate": [1, 2]}', Action("click", x=1, y=2)),
    ('{"action": "type", "text": "he said \\"hi\\" {"}', Action("type", text='he said "hi" {')),
    ('set {x} first, then {"action": "wait", "time": 1}', Action("wait", seconds=1.0)),
])
def test_json_objects_are_found_among_stray_braces_and_quotes(text, expected):
    assert parse_action(text) == expected
