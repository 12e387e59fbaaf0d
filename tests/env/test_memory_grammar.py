"""The free, bounded memory grammar (env/agent/action_space.py MemoryGrammar) and its token automaton: what it
admits, its bound, and that every response a policy can draw under it parses into a memory and an action."""

import json
import re

import numpy as np
import pytest

from jaxwebrl.env.agent.action_space import (CLICK_GRID, MEMORY_CONTENT_WORDS, MEMORY_GENERIC_WORDS, MemoryGrammar,
                                             response_regex, response_text)
from jaxwebrl.env.agent.actions import parse_action
from jaxwebrl.env.agent.memory import memory_stats, split_memory
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.action_grammar import action_constraint


def test_the_grammar_admits_content_and_generic_keys_within_its_bounds():
    g = MemoryGrammar(max_keys=3, value_chars=6)
    assert g.admits({}) and g.admits({"done": "2"}) and g.admits({"notes_3": "abc", "next": "red", "info": "x"})
    assert not g.admits({"a": "1"})                              # not a key word
    assert not g.admits({"done": "1234567"})                     # value over 6 characters
    assert not g.admits({"done": "Red"}) and not g.admits({"done": ""})   # [a-z0-9]{1,6}
    assert not g.admits({"done": 2})                             # values are strings
    assert not g.admits({"done": "1", "next": "2", "info": "3", "data": "4"})   # over 3 entries
    longest = {key: "z" * 6 for key in ("details_9", "details_8", "pressed_9")}   # the longest key words
    assert g.admits(longest) and len(json.dumps(longest, separators=(", ", ": "))) == g.max_chars == 69
    assert memory_stats({"notes_2": "a", "done": "1"}).generic_frac == 0.5   # generic words count as generic
    assert memory_stats({w: "1" for w in MEMORY_GENERIC_WORDS[:3]}).generic_frac == 1.0
    assert memory_stats({w: "1" for w in MEMORY_CONTENT_WORDS[:3]}).generic_frac == 0.0
    with pytest.raises(ValueError, match="max_keys"):
        MemoryGrammar(max_keys=0)


def _random_walk(constraint, rng, end, limit=200):
    state, tokens = constraint.initial_state, []
    while len(tokens) < limit:
        token = int(rng.choice(np.flatnonzero(constraint.allowed[state])))
        tokens.append(token)
        if token == end:
            return tokens
        state = int(constraint.next_state[state, token])
    raise AssertionError("a walk did not end within the bound")


def test_every_response_drawn_under_the_automaton_parses_into_a_bounded_memory_and_a_click():
    processor = tiny_processor()
    tok = processor.tokenizer
    grammar = MemoryGrammar(max_keys=2, value_chars=3)
    constraint = action_constraint(processor, CLICK_GRID, tok.vocab_size, memory=grammar)
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(200):
        tokens = _random_walk(constraint, rng, tok.eos_token_id)
        text = tok.decode(tokens[:-1])
        assert re.fullmatch(response_regex(CLICK_GRID, grammar), text)
        memory, rest = split_memory(text)
        assert memory is not None and len(memory) <= 2 and grammar.admits(memory)   # a repeated key: the last
        assert parse_action(rest.removeprefix("Action: ")).kind == "click"
        sizes.add(len(memory))
    assert sizes == {0, 1, 2}                                     # the memory may shrink to {} and grow to the bound
    # a response written by hand in the grammar's layout walks it; one outside it does not
    ok = tok.encode(response_text("click(450, 250)", {"done": "2"}), add_special_tokens=False).tolist()
    constraint.walk(ok + [tok.eos_token_id])
    bad = tok.encode(response_text("click(450, 250)", {"done": "2222"}), add_special_tokens=False).tolist()
    with pytest.raises(ValueError, match="not allowed"):
        constraint.walk(bad)
