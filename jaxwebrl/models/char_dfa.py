"""A regex as a character DFA, and every token of a vocabulary walked through it at once: what
`TokenConstraint.from_regex` builds its token automaton from.

    dfa = CharDFA.compile(r'click\\((\\d{1,3}), (\\d{1,3})\\)')   # Thompson NFA, subset construction (lazily)
    walker = VocabularyWalker(dfa, token_strings, skip=(end_token_id,))
    tokens, ends = walker.walk(dfa.start)   # int64 [n] ascending, int64 [n]: the tokens whose whole text stays
                                            # in the DFA from that state, and the DFA state each one ends in

The walker never walks a character on its own: characters the regex cannot tell apart (the same answer from every
character test of the NFA) share one class, so a DFA transition is computed once for a (state, class), and all
tokens advance one character a numpy step. Over Qwen's 151,936 tokens a verdict grammar is built in under a
second and the long recipe's free-memory action grammar in a few, where walking each token's text in Python took
10-20 s and ~100 s (`bench/grammar_cost.py`, docs/env.md).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

try:  # Python 3.11+
    import re._constants as sre_constants
    import re._parser as sre_parse
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_UNKNOWN, _DEAD = -2, -1   # VocabularyWalker's transition table: not computed yet, no NFA state left


class CharDFA:
    """A character DFA built from a regex by Thompson's construction and the subset construction (lazily)."""

    def __init__(self, builder: "_NFABuilder", nfa_start: int, nfa_accept: int):
        self._edges = builder.edges  # state -> list of (predicate, next)
        self._eps = builder.eps  # state -> list of next
        self._accept = nfa_accept
        self.literals = frozenset(builder.literals)   # code points of the literal tests (`a`, `[^a]`)
        self.broad_tests = tuple(builder.broad.values())   # the other tests (classes, `.`), one per distinct test
        self._states: dict[frozenset, int] = {}
        self._sets: list[frozenset] = []
        self._step: dict[tuple[int, str], int | None] = {}
        self.start = self._intern(self._closure({nfa_start}))

    @classmethod
    def compile(cls, pattern: str) -> "CharDFA":
        builder = _NFABuilder()
        start, accept = builder.build(sre_parse.parse(pattern))
        return cls(builder, start, accept)

    def _closure(self, states) -> frozenset:
        stack, seen = list(states), set(states)
        while stack:
            for nxt in self._eps.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)

    def _intern(self, nfa_set: frozenset) -> int:
        if nfa_set not in self._states:
            self._states[nfa_set] = len(self._sets)
            self._sets.append(nfa_set)
        return self._states[nfa_set]

    def step(self, state: int, char: str) -> int | None:
        """The DFA state after `char` from `state`; None when no NFA state is left (no match can follow)."""
        key = (state, char)
        if key not in self._step:
            moved = {nxt for s in self._sets[state] for pred, nxt in self._edges.get(s, ()) if pred(char)}
            self._step[key] = self._intern(self._closure(moved)) if moved else None
        return self._step[key]

    @property
    def num_states(self) -> int:
        """DFA states interned so far (they are made as walks reach them)."""
        return len(self._sets)

    @property
    def accepting(self) -> set[int]:
        return {i for i, s in enumerate(self._sets) if self._accept in s}


class VocabularyWalker:
    """Every token text of a vocabulary walked through a `CharDFA` at once (module docstring).

    token_strings: [V] each token's text, None (or "") for tokens never walked; `skip`: ids never walked either.
    """

    def __init__(self, dfa: CharDFA, token_strings: Sequence[str | None], skip: Sequence[int] = ()):
        self._dfa = dfa
        skipped = {int(t) for t in skip}
        self._ids = np.asarray([v for v, text in enumerate(token_strings) if text and v not in skipped], np.int64)
        texts = [token_strings[v] for v in self._ids]
        self._lengths = np.asarray([len(t) for t in texts], np.int64)
        self._offsets = np.cumsum(self._lengths) - self._lengths   # [n]: where each token's text starts
        codes = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), np.uint32)
        distinct, inverse = np.unique(codes, return_inverse=True)
        classes, self._representatives = _character_classes(dfa, [chr(c) for c in distinct])
        self._classes = classes[inverse].astype(np.int64)   # [sum of lengths]: each character's class
        self._first = self._classes[self._offsets]            # [n]: each token's first character's class
        self._table = np.full((max(64, dfa.num_states), len(self._representatives)), _UNKNOWN, np.int64)

    def walk(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int64 [n] ascending, end DFA states int64 [n]): the tokens whose whole text walks from DFA
        `state` without running out of NFA states, and where each one ends."""
        states = self._row(int(state))[self._first]   # the first character: one row of the table, per token
        index = np.flatnonzero(states != _DEAD)
        states = states[index]
        done_index, done_states = [index[:0]], [states[:0]]
        position = 1
        while index.size:
            done = self._lengths[index] == position
            done_index.append(index[done])
            done_states.append(states[done])
            index, states = index[~done], states[~done]
            if not index.size:
                break
            states = self._transitions(states, self._classes[self._offsets[index] + position])
            alive = states != _DEAD
            index, states = index[alive], states[alive]
            position += 1
        index, states = np.concatenate(done_index), np.concatenate(done_states)
        order = np.argsort(index, kind="stable")
        return self._ids[index[order]], states[order]

    def _row(self, state: int) -> np.ndarray:
        """int64 [classes]: the DFA state after a character of each class from `state`, all computed."""
        for cls in np.flatnonzero(self._table[state] == _UNKNOWN).tolist():
            self._store(state, cls)
        self._grow()
        return self._table[state]

    def _transitions(self, states: np.ndarray, classes: np.ndarray) -> np.ndarray:
        """The DFA state after a character of each class from each state (`_DEAD` where none is left), computing
        the (state, class) transitions not yet in the table."""
        found = self._table[states, classes]
        unknown = found == _UNKNOWN
        if unknown.any():
            width = self._table.shape[1]
            for pair in np.unique(states[unknown] * width + classes[unknown]).tolist():
                self._store(*divmod(pair, width))
            self._grow()
            found = self._table[states, classes]
        return found

    def _store(self, state: int, cls: int) -> None:
        nxt = self._dfa.step(state, self._representatives[cls])
        self._table[state, cls] = _DEAD if nxt is None else nxt

    def _grow(self) -> None:
        """Rows for the DFA states that new transitions made."""
        if self._dfa.num_states > len(self._table):
            grown = np.full((2 * self._dfa.num_states, self._table.shape[1]), _UNKNOWN, np.int64)
            grown[:len(self._table)] = self._table
            self._table = grown


def _character_classes(dfa: CharDFA, chars: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """(class of each of `chars` int64 [n], one representative character a class): a code point a literal test
    names (`a`, `[^a]`) is its own class; the others are told apart only by the answers of the DFA's broad tests (a
    class `[...]`, `.`), so two characters of one class take every NFA edge alike."""
    keys: dict[tuple, int] = {}
    representatives: list[str] = []
    classes = np.empty(len(chars), np.int64)
    for i, char in enumerate(chars):
        key = ("literal", char) if ord(char) in dfa.literals else tuple(test(char) for test in dfa.broad_tests)
        if key not in keys:
            keys[key] = len(representatives)
            representatives.append(char)
        classes[i] = keys[key]
    return classes, representatives


class _NFABuilder:
    """Thompson NFA from a `re` parse tree; edges carry character predicates. Beside them it records what tells
    characters apart: the code points of the literal tests (`literals`) and every other distinct test (`broad`,
    keyed by the parse-tree item it came from)."""

    def __init__(self):
        self.edges: dict[int, list] = {}
        self.eps: dict[int, list[int]] = {}
        self.count = 0
        self.literals: set[int] = set()
        self.broad: dict[tuple, Callable[[str], bool]] = {}

    def _new(self) -> int:
        self.count += 1
        return self.count - 1

    def _eps(self, a: int, b: int) -> None:
        self.eps.setdefault(a, []).append(b)

    def _char(self, pred) -> tuple[int, int]:
        a, b = self._new(), self._new()
        self.edges.setdefault(a, []).append((pred, b))
        return a, b

    def _broad(self, key: tuple, pred: Callable[[str], bool]) -> Callable[[str], bool]:
        return self.broad.setdefault(key, pred)

    def build(self, tree) -> tuple[int, int]:
        start = end = self._new()
        for op, arg in tree:
            a, b = self._node(op, arg)
            self._eps(end, a)
            end = b
        return start, end

    def _node(self, op, arg) -> tuple[int, int]:
        c = sre_constants
        if op is c.LITERAL:
            self.literals.add(arg)
            return self._char(lambda ch, code=arg: ord(ch) == code)
        if op is c.NOT_LITERAL:
            self.literals.add(arg)
            return self._char(lambda ch, code=arg: ord(ch) != code)
        if op is c.ANY:
            return self._char(self._broad(("any",), lambda ch: ch != "\n"))
        if op is c.IN:   # its members are told apart by its own answer: no code point of it needs its own class
            return self._char(self._broad(("in", repr(arg)), _class_predicate(arg)))
        if op is c.SUBPATTERN:
            return self.build(arg[-1])
        if op is c.BRANCH:
            start, end = self._new(), self._new()
            for alternative in arg[1]:
                a, b = self.build(alternative)
                self._eps(start, a)
                self._eps(b, end)
            return start, end
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)):
            low, high, sub = arg
            start = end = self._new()
            for _ in range(low):
                a, b = self.build(sub)
                self._eps(end, a)
                end = b
            if high == c.MAXREPEAT:
                a, b = self.build(sub)
                self._eps(end, a)
                self._eps(b, a)
                loop_end = self._new()
                self._eps(end, loop_end)
                self._eps(b, loop_end)
                return start, loop_end
            final = self._new()
            self._eps(end, final)
            for _ in range(high - low):
                a, b = self.build(sub)
                self._eps(end, a)
                self._eps(b, final)
                end = b
            return start, final
        if op is c.AT:
            a = self._new()
            return a, a  # anchors: the whole text is matched anyway
        raise ValueError(f"regex feature {op} is not supported in constraints (use literals, classes, groups, "
                         "alternation and repetition)")


def _class_predicate(items):
    c = sre_constants
    categories = {
        c.CATEGORY_DIGIT: str.isdigit, c.CATEGORY_NOT_DIGIT: lambda ch: not ch.isdigit(),
        c.CATEGORY_SPACE: str.isspace, c.CATEGORY_NOT_SPACE: lambda ch: not ch.isspace(),
        c.CATEGORY_WORD: lambda ch: ch.isalnum() or ch == "_",
        c.CATEGORY_NOT_WORD: lambda ch: not (ch.isalnum() or ch == "_"),
    }
    negate = any(op is c.NEGATE for op, _ in items)
    tests = []
    for op, arg in items:
        if op is c.LITERAL:
            tests.append(lambda ch, code=arg: ord(ch) == code)
        elif op is c.RANGE:
            tests.append(lambda ch, lo=arg[0], hi=arg[1]: lo <= ord(ch) <= hi)
        elif op is c.CATEGORY:
            tests.append(categories[arg])
        elif op is not c.NEGATE:
            raise ValueError(f"character-class item {op} is not supported in constraints")
    return lambda ch: any(t(ch) for t in tests) != negate


_ = re  # the `re` syntax is what CharDFA.compile accepts
