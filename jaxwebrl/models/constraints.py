"""Token-level constraints for constrained decoding: automata whose states say which tokens may come next.

A `TokenConstraint` has `allowed [S, V] bool` (tokens a row in state s may sample) and `next_state [S, V]
int32`; the sampler masks disallowed tokens before temperature/top-k/top-p and advances each row's state.

Builders:
- `from_vocab_mask(allowed [V])`: one state.
- `from_token_sequences(seqs, V, end)`: exactly a finite set of token sequences, then the end token (a trie).
- `from_texts(tokenizer, texts, V)`: exactly the tokenisation of each text, then the tokenizer's end token (the
  action grammar's responses, `jaxwebrl.env.agent.action_space.response_texts`).
- `from_regex(pattern, token_strings, end)`: any token sequence whose text fully matches `pattern` (Python `re`
  syntax: literals, classes, `.`, groups, `|`, `?`, `*`, `+`, `{m,n}`), then the end token. The pattern is
  compiled to a character DFA (`jaxwebrl.models.char_dfa`), and a token is allowed in a state when its whole
  text walks the DFA without leaving the states from which a match can still be completed (all tokens walked at
  once, character class by character class). E.g. well-formed actions for the tiny policy:
  `from_regex(r'click\\((\\d{1,3}), (\\d{1,3})\\)|go_back\\(\\)', strings, im_end)`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxwebrl.models.char_dfa import CharDFA, VocabularyWalker

# A token automaton's edges, one entry a state: (tokens int64 [n], next state int64 [n]).
Edges = list[tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class TokenConstraint:
    """Token automaton: `allowed [S, V] bool`, `next_state [S, V] int32`; rows start in `initial_state`."""

    allowed: np.ndarray
    next_state: np.ndarray
    initial_state: int = 0

    def __post_init__(self):
        if self.allowed.shape != self.next_state.shape or self.allowed.ndim != 2:
            raise ValueError(f"allowed {self.allowed.shape} and next_state {self.next_state.shape} must both be [S, V]")
        if not self.allowed.any(axis=1).all():
            dead = np.flatnonzero(~self.allowed.any(axis=1)).tolist()
            raise ValueError(f"constraint states {dead} allow no token: every state needs at least one (e.g. an end token)")

    @classmethod
    def from_vocab_mask(cls, allowed: np.ndarray) -> "TokenConstraint":
        """One state: only tokens with `allowed[v]` are ever sampled."""
        allowed = np.asarray(allowed, bool).reshape(1, -1)
        return cls(allowed, np.zeros(allowed.shape, np.int32), 0)

    @classmethod
    def from_token_sequences(cls, sequences: Sequence[Sequence[int]], vocab_size: int, end_token_id: int,
                             after_end: Sequence[int] | None = None) -> "TokenConstraint":
        """Admits exactly `seq + [end_token_id]` for each of `sequences` (a trie). After the end token, the
        row may only emit `after_end` tokens (default: the end token again; a stop token ends it anyway)."""
        if not sequences:
            raise ValueError("from_token_sequences needs at least one sequence")
        children: list[dict[int, int]] = [{}]
        terminal = [False]
        for seq in sequences:
            node = 0
            for token in seq:
                if not 0 <= int(token) < vocab_size:
                    raise ValueError(f"token {token} of sequence {list(seq)} is outside the vocabulary [0, {vocab_size})")
                if int(token) not in children[node]:
                    children[node][int(token)] = len(children)
                    children.append({})
                    terminal.append(False)
                node = children[node][int(token)]
            terminal[node] = True
        edges = [(np.fromiter(kids, np.int64, len(kids)), np.fromiter(kids.values(), np.int64, len(kids)))
                 for kids in children]
        return _with_end_state(edges, terminal, vocab_size, end_token_id, after_end)

    @classmethod
    def from_texts(cls, tokenizer, texts: Sequence[str], vocab_size: int) -> "TokenConstraint":
        """Admits exactly `tokenizer.encode(text)` (no special tokens) + `tokenizer.eos_token_id` for each text."""
        sequences = [np.asarray(tokenizer.encode(text, add_special_tokens=False)).tolist() for text in texts]
        return cls.from_token_sequences(sequences, vocab_size, end_token_id=tokenizer.eos_token_id)

    @classmethod
    def from_regex(cls, pattern: str, token_strings: Sequence[str | None], end_token_id: int,
                   after_end: Sequence[int] | None = None) -> "TokenConstraint":
        """Token sequences whose concatenated text fully matches `pattern`, then `end_token_id`.

        `token_strings[v]` is token v's text (None for tokens that may never appear, e.g. special tokens);
        build it with `[tokenizer.decode([v]) for v in range(V)]`, mapping special tokens to None.
        """
        dfa = CharDFA.compile(pattern)
        vocab_size = len(token_strings)
        walker = VocabularyWalker(dfa, token_strings, skip=(end_token_id,))
        index = {dfa.start: 0}  # DFA state -> automaton state, over the states token walks can reach
        walks: list[tuple[np.ndarray, np.ndarray]] = [None]   # each automaton state's (tokens, end DFA states)
        frontier = [dfa.start]
        while frontier:
            state = frontier.pop()
            tokens, ends = walker.walk(state)
            distinct, first = np.unique(ends, return_index=True)
            for end in distinct[np.argsort(first)].tolist():   # numbered in the order tokens first reach them
                if end not in index:
                    index[end] = len(walks)
                    walks.append(None)
                    frontier.append(end)
            walks[index[state]] = (tokens, ends)
        accepting = dfa.accepting
        terminal = [False] * len(walks)
        for state, i in index.items():
            terminal[i] = state in accepting
        lookup = np.zeros(max(index) + 1, np.int64)
        lookup[list(index)] = list(index.values())
        edges = [(tokens, lookup[ends]) for tokens, ends in walks]
        edges, terminal, start = _prune(edges, terminal, 0)
        if start is None:
            raise ValueError(f"no token sequence of this vocabulary spells a match of {pattern!r}")
        return _with_end_state(edges, terminal, vocab_size, end_token_id, after_end, start)

    def padded(self, num_states: int) -> "TokenConstraint":
        """The same automaton with unreachable states appended up to `num_states` (copies of the last state), so
        automata of different sizes share one table shape `[num_states, V]` (a sampler compiles once for them)."""
        extra = int(num_states) - len(self.allowed)
        if extra < 0:
            raise ValueError(f"cannot pad {len(self.allowed)} states to {num_states}")
        last = len(self.allowed) - 1
        return TokenConstraint(np.concatenate([self.allowed, np.repeat(self.allowed[-1:], extra, 0)]),
                               np.concatenate([self.next_state, np.full((extra, self.allowed.shape[1]), last,
                                                                        np.int32)]), self.initial_state)

    def compact(self, min_columns: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(allowed [S, K] bool, next_state [S, K] int32, column [V] int32): the same automaton over K token columns,
        K << V for a grammar that admits few distinct tokens (a verdict over Qwen's 151,936 ids: ~160). Tokens every
        state treats alike (allowed in the same states, to the same next states) share a column, and tokens no state
        allows share column 0, which allows nothing: `allowed[:, column]` is this `allowed`, and
        `next_state[s, column[v]]` is this `next_state[s, v]` wherever `allowed[s, v]` (a decoder reads the next state
        only of a token it drew, so the others are 0). K is padded to a power of two, at least `min_columns`, so
        automata with a few more or fewer distinct tokens share one table shape (and one compiled decode)."""
        active = np.flatnonzero(self.allowed.any(axis=0))
        codes = np.where(self.allowed[:, active], self.next_state[:, active] + 1, 0)   # [S, A], 0: not allowed
        distinct, inverse = np.unique(codes.T, axis=0, return_inverse=True)            # [K - 1, S]
        width = max(int(min_columns), 1 << len(distinct).bit_length())                # > len(distinct): column 0
        column = np.zeros(self.allowed.shape[1], np.int32)
        column[active] = inverse.reshape(-1) + 1
        allowed = np.zeros((len(self.allowed), width), bool)
        next_state = np.zeros((len(self.allowed), width), np.int32)
        allowed[:, 1:len(distinct) + 1] = distinct.T > 0
        next_state[:, 1:len(distinct) + 1] = np.maximum(distinct.T - 1, 0)
        return allowed, next_state, column

    @property
    def choice_states(self) -> np.ndarray:
        """bool [S]: the states that admit more than one token (a token drawn there was a decision)."""
        return self.allowed.sum(axis=1) > 1

    def forced_prefix(self, stop_token_ids: Sequence[int] = (), limit: int | None = None) -> tuple[np.ndarray, int]:
        """(tokens [P] int32, state after them): what every row must emit first. From the initial state, while a
        state admits exactly one token that is not a stop token, that token is forced (its log-prob under the
        restricted policy is exactly 0). At most `limit` tokens. The sampler prefills them with the prompt."""
        stops = {int(t) for t in stop_token_ids}
        limit = len(self.allowed) if limit is None else limit   # a forced chain longer than S would be a cycle
        state, tokens = self.initial_state, []
        while len(tokens) < limit:
            admitted = np.flatnonzero(self.allowed[state])
            if len(admitted) != 1 or int(admitted[0]) in stops:
                break
            tokens.append(int(admitted[0]))
            state = int(self.next_state[state, admitted[0]])
        return np.asarray(tokens, np.int32), state

    def walk(self, tokens: Sequence[int]) -> np.ndarray:
        """int32 [L]: the state in which each of `tokens` was chosen, walking from the initial state (so
        `allowed[states[i]]` is the set token i was drawn from). A token the automaton does not allow raises
        ValueError: the tokens were not generated under this constraint."""
        state, out = self.initial_state, np.zeros(len(tokens), np.int32)
        for i, token in enumerate(tokens):
            if not self.allowed[state, int(token)]:
                raise ValueError(f"token {int(token)} at position {i} is not allowed by this constraint: the response "
                                 "was not generated under it (did model.constrained_actions or the task set change?)")
            out[i] = state
            state = int(self.next_state[state, int(token)])
        return out

    def replay(self, input_ids: np.ndarray, loss_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(states [B, T] int32, admitted [B] bool): the state each policy token (`loss_mask` 1) of step rows was
        drawn in, -1 elsewhere; admitted[b] is False when a response of row b is not in the grammar (not decoded
        under it: scripted or demonstration episodes, or a grammar that changed since), whose states stay -1.

        Each maximal run of policy tokens in a row is one response, replayed from the initial state.
        input_ids, loss_mask: [B, T] integer arrays (padding has loss_mask 0).
        """
        input_ids, policy = np.asarray(input_ids), np.asarray(loss_mask).astype(bool)
        states = np.full(policy.shape, -1, np.int32)
        admitted = np.ones(policy.shape[0], bool)
        for b in range(policy.shape[0]):
            edges = np.flatnonzero(np.diff(np.concatenate([[0], policy[b].astype(np.int8), [0]])))
            for start, end in zip(edges[::2], edges[1::2]):
                try:
                    states[b, start:end] = self.walk(input_ids[b, start:end])
                except ValueError:
                    admitted[b] = False
            if not admitted[b]:
                states[b] = -1
        return states, admitted

    def decision_mask(self, states: np.ndarray, loss_mask: np.ndarray, admitted: np.ndarray) -> np.ndarray:
        """[B, T] int32: the policy tokens that carry loss — in admitted rows those drawn in a state that admitted
        more than one token, in the other rows every policy token (they are trained unconstrained)."""
        free = (states >= 0) & self.choice_states[np.maximum(states, 0)]
        return np.where(admitted[:, None], free, np.asarray(loss_mask) > 0).astype(np.int32)


def _prune(edges: Edges, terminal: list[bool], start: int) -> tuple[Edges, list[bool], int | None]:
    """Drops states from which no terminal state is reachable (and edges into them); renumbers from 0 in the old
    order. The start's new number, None when it is dropped."""
    before: list[list[int]] = [[] for _ in edges]   # each state's predecessors
    for i, (_, nxt) in enumerate(edges):
        for j in np.unique(nxt).tolist():
            before[j].append(i)
    alive = [i for i, t in enumerate(terminal) if t]
    seen = set(alive)
    while alive:
        for i in before[alive.pop()]:
            if i not in seen:
                seen.add(i)
                alive.append(i)
    if start not in seen:
        return [], [], None
    order = sorted(seen)
    renumber = np.full(len(edges), -1, np.int64)
    renumber[order] = np.arange(len(order))
    pruned = []
    for i in order:
        tokens, nxt = edges[i]
        kept = renumber[nxt] >= 0
        pruned.append((tokens[kept], renumber[nxt[kept]]))
    return pruned, [terminal[i] for i in order], int(renumber[start])


def _with_end_state(edges: Edges, terminal, vocab_size, end_token_id, after_end, start: int = 0) -> TokenConstraint:
    """Tables for `edges` plus a final state entered by `end_token_id` from terminal states."""
    done_state = len(edges)
    allowed = np.zeros((done_state + 1, vocab_size), bool)
    next_state = np.full((done_state + 1, vocab_size), done_state, np.int32)
    for node, (tokens, nxt) in enumerate(edges):
        allowed[node, tokens] = True
        next_state[node, tokens] = nxt
        if terminal[node]:
            allowed[node, end_token_id] = True
    allowed[done_state, list(after_end) if after_end is not None else [end_token_id]] = True
    return TokenConstraint(allowed, next_state, start)
