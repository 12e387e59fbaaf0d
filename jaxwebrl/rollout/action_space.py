"""The constrained action space of a policy that has never seen the action grammar (the tiny default).

Such a policy decodes under a token automaton that admits exactly ``Memory: {}\\nAction: <text>`` + end token
for each action text of the tasks (toy buttons, clicks on a grid of the 0-1000 space). The policy is the model
restricted to the grammar: the policy server samples under it and records log-probs under it; the trainer
replays the automaton over the sampled tokens to recompute the same restricted log-probs, and takes the loss
over the positions where the grammar left a choice (the forced tokens — ~33 of the 35 of a toy response — have
log-prob 0 and would otherwise only dilute the token-mean of the one token that matters).

    texts = config_action_texts(config)                            # None when model.constrained_actions is off
    constraint = action_constraint(processor, texts, vocab_size)   # TokenConstraint
    states, admitted = constraint_states(constraint, input_ids, loss_mask)   # [B, T] state of each policy token
    mask = decision_mask(constraint, states, loss_mask, admitted)            # [B, T] policy tokens with a choice
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.train.config_validation import env_specs

# Clicks on a 100-unit grid of the 0-1000 space (centres of a 10 × 10 grid).
CLICK_GRID = tuple(f"click({x}, {y})" for y in range(50, 1000, 100) for x in range(50, 1000, 100))
RESPONSE_PREFIX = "Memory: {}\nAction: "


def constrained_action_texts(specs: list[str]) -> tuple[str, ...]:
    """The action texts a constrained policy may emit for these env specs."""
    from jaxwebrl.env import toy

    texts: list[str] = []
    if "toy" in specs:
        texts += toy.ACTION_TEXTS
    if any(spec != "toy" for spec in specs):
        texts += [t for t in CLICK_GRID if t not in texts]
    return tuple(texts)


def config_action_texts(config) -> tuple[str, ...] | None:
    """The config's constrained action texts, or None when `model.constrained_actions` is off."""
    return constrained_action_texts(env_specs(config)) if config.model.constrained_actions else None


def action_constraint(processor, action_texts, vocab_size: int) -> TokenConstraint:
    """Token automaton admitting exactly `Memory: {}\\nAction: <text>` + end token for each text."""
    tokenizer = processor.tokenizer
    sequences = [tokenizer.encode(RESPONSE_PREFIX + text, add_special_tokens=False).tolist() for text in action_texts]
    return TokenConstraint.from_token_sequences(sequences, vocab_size, end_token_id=tokenizer.eos_token_id)


def constraint_states(constraint: TokenConstraint, input_ids: np.ndarray,
                      loss_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(states [B, T] int32, admitted [B] bool): the automaton state each policy token (`loss_mask` 1) was drawn
    in, -1 elsewhere; admitted[b] is False when a response of row b is not in the grammar (not decoded under
    it: scripted or demonstration episodes, or a grammar that changed since), whose states stay -1.

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
                states[b, start:end] = constraint.walk(input_ids[b, start:end])
            except ValueError:
                admitted[b] = False
        if not admitted[b]:
            states[b] = -1
    return states, admitted


def decision_mask(constraint: TokenConstraint, states: np.ndarray, loss_mask: np.ndarray,
                  admitted: np.ndarray) -> np.ndarray:
    """[B, T] int32: the policy tokens that carry loss — in admitted rows those drawn in a state that admitted
    more than one token, in the other rows every policy token (they are trained unconstrained)."""
    free = (states >= 0) & constraint.choice_states[np.maximum(states, 0)]
    return np.where(admitted[:, None], free, np.asarray(loss_mask) > 0).astype(np.int32)
