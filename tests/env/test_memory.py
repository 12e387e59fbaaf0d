"""Memory JSON: parsing from responses, carrying forward, and the memory-bloat statistics."""

from jaxwebrl.env.agent.actions import parse_action
from jaxwebrl.env.agent.memory import (MemoryTracker, format_memory, is_generic_key, memory_stats, parse_memory,
                                 split_memory)


def test_parse_takes_the_last_memory_outside_think_spans():
    text = ('<think>Memory: {"draft": 1}</think>Memory: {"old": 1}\nMemory: {"user": "bob", "done": [1, 2]}\n'
            "Action: click(250, 500)")
    assert parse_memory(text) == {"user": "bob", "done": [1, 2]}


def test_malformed_or_missing_memory_is_none():
    for text in ("Action: click(1, 2)", "Memory: {broken", "Memory: [1, 2]", "Memory: none {\"a\": 1}", ""):
        assert parse_memory(text) is None, text
    assert parse_memory("Memory: {broken} then Memory: {\"a\": 1}") == {"a": 1}


def test_split_memory_leaves_the_action_for_the_parser():
    memory, rest = split_memory('Memory: {"action": "type", "n": {"x": 1}}\nAction: click(250, 500)')
    assert memory == {"action": "type", "n": {"x": 1}}
    assert rest == "Action: click(250, 500)"
    action = parse_action(rest)
    assert (action.kind, action.x, action.y) == ("click", 250, 500)
    assert split_memory("<think>a</think> click(1, 2)") == (None, "click(1, 2)")


def test_generic_keys():
    for key in ("info", "notes_2", "additional_details", "step_7", "misc", "extraInfo", "item3", "42", "key-1"):
        assert is_generic_key(key), key
    for key in ("username", "login_status", "target_button", "password2", "clicked_items_count"):
        assert not is_generic_key(key), key


def test_stats_count_nested_keys_and_generic_fraction():
    memory = {"username": "bob", "info": {"notes": "x", "password": "p"}, "items": [{"entry_1": 1}]}
    stats = memory_stats(memory)
    assert stats.keys == 6  # username, info, notes, password, items, entry_1
    assert stats.generic_frac == 4 / 6  # info, notes, items, entry_1
    assert stats.chars == len(format_memory(memory))
    assert memory_stats(None) == memory_stats({}) and memory_stats({}).keys == 0


def test_tracker_carries_memory_forward_and_counts_missing():
    tracker = MemoryTracker()
    assert tracker.update('Memory: {"a": 1}\nAction: click(1, 1)').keys == 1
    stats = tracker.update("Action: click(1, 1)")  # no memory: keep the previous one
    assert tracker.memory == {"a": 1} and stats.keys == 1 and tracker.missing == 1
    assert tracker.update('Memory: {"a": 1, "notes": "x"}').generic_frac == 0.5
