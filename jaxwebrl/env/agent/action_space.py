"""The action grammar: what a policy decoding under it may say, per environment, and how a response is laid out.

A policy that has never seen the action grammar (the tiny default) decodes under a token automaton that admits
exactly `RESPONSE_PREFIX + text` + the end token for each action text of its tasks: each registered env's own
texts (the toy's two button presses), and for a browser page the centres of a 10 × 10 grid of the 0-1000
coordinate space. The policy is the model restricted to the grammar: the policy server samples under it and
records log-probs under it; the trainer replays the automaton over the sampled tokens to recompute the same
restricted log-probs, and takes the loss where the grammar left a choice (the forced tokens — ~33 of the 35 of a
toy response — have log-prob 0 and would only dilute the token mean of the one that matters).

    texts = config_action_texts(config)      # None when model.constrained_actions is off
    responses = response_texts(texts)        # "Memory: {}\\nAction: click(250, 500)", ...

The token side (the automaton over a tokenizer's ids, its replay over step rows) is
`jaxwebrl.models.constraints.TokenConstraint` (`from_texts`, `replay`, `decision_mask`).
"""

from __future__ import annotations

from jaxwebrl.env.registry import env_specs, registered_entry

# Clicks on a 100-unit grid of the 0-1000 space (centres of a 10 × 10 grid).
CLICK_GRID = tuple(f"click({x}, {y})" for y in range(50, 1000, 100) for x in range(50, 1000, 100))
RESPONSE_PREFIX = "Memory: {}\nAction: "


def action_texts(specs) -> tuple[str, ...]:
    """The action texts a constrained policy may emit for these env specs (each text once, in first-seen order):
    a registered env's own `action_texts`, the click grid for every other env (a browser page)."""
    texts: list[str] = []
    for spec in specs:
        entry = registered_entry(spec)
        own = entry.action_texts if entry is not None and entry.action_texts is not None else CLICK_GRID
        texts += [t for t in own if t not in texts]
    return tuple(texts)


def config_action_texts(config) -> tuple[str, ...] | None:
    """The run config's constrained action texts (of `env.tasks`), or None when `model.constrained_actions` is off."""
    return action_texts(env_specs(config.env.tasks)) if config.model.constrained_actions else None


def response_texts(texts) -> list[str]:
    """The whole response a constrained policy emits for each action text (the end token follows)."""
    return [RESPONSE_PREFIX + text for text in texts]
