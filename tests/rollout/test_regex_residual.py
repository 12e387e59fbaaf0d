"""residual_regex: what a response that begins with a prefix may still emit, checked against Python's `re` itself
(exhaustively on small patterns, on sampled responses of the long variant's free-memory action grammar)."""

import itertools
import random
import re

import pytest

from configs.constT10 import get_config
from jaxwebrl.env.agent.action_space import config_memory_grammar, response_regex
from jaxwebrl.env.registry import config_action_texts
from jaxwebrl.rollout.engines.regex_residual import residual_regex

SMALL = [r"ab|a(b|c)*d", r"[a-c]{2,3}b?", r"(ab){1,2}c|a[^b]", r"\d+x|\dy{0,2}", r"(a|ab)(c|bcd)?", r"a.b", r"[^ab]c*",
         r"(a?b){2}"]


@pytest.mark.parametrize("pattern", SMALL)
def test_the_residual_matches_exactly_the_continuations_re_accepts(pattern):
    words = lambda n: ["".join(s) for k in range(n + 1) for s in itertools.product("abcdx1y", repeat=k)]
    tails = words(4)
    for prefix in words(3):
        try:
            rest = re.compile(residual_regex(pattern, prefix))
        except ValueError:   # refused: then no continuation (in reach) makes a match
            assert not any(re.fullmatch(pattern, prefix + q) for q in tails), (pattern, prefix)
            continue
        for q in tails:
            assert bool(rest.fullmatch(q)) == bool(re.fullmatch(pattern, prefix + q)), (pattern, prefix, q)


def test_on_the_long_variants_free_memory_grammar_every_split_of_a_response_is_exact():
    config = get_config("long")
    pattern = response_regex(config_action_texts(config), config_memory_grammar(config))
    full = re.compile(pattern)
    rng = random.Random(0)
    responses = ['Memory: {}\nAction: click(50, 50)', 'Memory: {"goal": "red"}\nAction: click(950, 950)',
                 'Memory: {"next": "b2", "count_3": "x", "info": "abcdef"}\nAction: click(450, 150)']
    assert all(full.fullmatch(r) for r in responses)
    for response in responses:
        for cut in range(len(response) + 1):
            prefix, tail = response[:cut], response[cut:]
            rest = re.compile(residual_regex(pattern, prefix))
            assert rest.fullmatch(tail), (prefix, tail)
            for _ in range(20):   # a broken tail: a character changed, dropped or added
                chars = list(tail)
                edit = rng.randrange(3)
                at = rng.randrange(len(chars) + 1)
                if edit == 0 and chars:
                    chars[min(at, len(chars) - 1)] = rng.choice('abz09{}", ()\n')
                elif edit == 1 and chars:
                    del chars[min(at, len(chars) - 1)]
                else:
                    chars.insert(at, rng.choice('az9", }'))
                q = "".join(chars)
                assert bool(rest.fullmatch(q)) == bool(full.fullmatch(prefix + q)), (prefix, q)
    assert residual_regex(pattern, responses[0]) == ""   # complete: only the end token may follow


def test_a_prefix_that_begins_no_match_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'Memory: \{x' does not begin any match of the pattern \(it leaves at 'x'\)"):
        residual_regex(r"Memory: \{\}", "Memory: {x")
    with pytest.raises(ValueError, match="not supported"):
        residual_regex(r"(a)\1", "a")
