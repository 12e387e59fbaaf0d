"""The action grammar: what a policy decoding under it may say, per environment, and how a response is laid out.

A policy that has never seen the action grammar (the tiny default) decodes under a token automaton that admits
exactly `RESPONSE_PREFIX + text` + the end token for each action text of its tasks: each registered env's own
texts (the toy's two button presses), and for a browser page the centres of a 10 × 10 grid of the 0-1000
coordinate space, or of the finer grid its task declares (`registry.click_grid_size`: 20 × 20 for
click-checkboxes-large and choose-date, whose small targets the 10 × 10 grid misses). The policy is the model restricted to the grammar: the policy server samples under it and
records log-probs under it; the trainer replays the automaton over the sampled tokens to recompute the same
restricted log-probs, and takes the loss where the grammar left a choice (the forced tokens — ~33 of the 35 of a
toy response — have log-prob 0 and would only dilute the token mean of the one that matters).

    texts = config_action_texts(config)      # None when model.constrained_actions is off
    responses = response_texts(texts)        # "Memory: {}\\nAction: click(250, 500)", ...

The token side (the automaton over a tokenizer's ids, its replay over step rows) is
`jaxwebrl.models.constraints.TokenConstraint` (`from_texts`, `replay`, `decision_mask`).
"""

from __future__ import annotations

from jaxwebrl.env.registry import click_grid_size, env_specs, registered_entry


def click_grid(columns: int, rows: int) -> tuple[str, ...]:
    """The clicks at the cell centres of a columns × rows grid over the 0-1000 space, row by row."""
    if not (1 <= columns <= 1000 and 1 <= rows <= 1000):
        raise ValueError(f"click grid {columns} x {rows}: each side must be in 1..1000")
    return tuple(f"click({(2 * i + 1) * 1000 // (2 * columns)}, {(2 * j + 1) * 1000 // (2 * rows)})"
                 for j in range(rows) for i in range(columns))


CLICK_GRID = click_grid(10, 10)   # a 100-unit grid: click(50, 50) ... click(950, 950)
RESPONSE_PREFIX = "Memory: {}\nAction: "


def action_texts(specs) -> tuple[str, ...]:
    """The action texts a constrained policy may emit for these env specs (each text once, in first-seen order):
    a registered env's own `action_texts`, the click grid for every other env (a browser page): the one its
    task declares, else CLICK_GRID."""
    texts: list[str] = []
    seen: set[str] = set()
    for spec in specs:
        entry = registered_entry(spec)
        if entry is not None and entry.action_texts is not None:
            own = entry.action_texts
        else:
            size = click_grid_size(spec)
            own = CLICK_GRID if size is None else click_grid(*size)
        texts += [t for t in own if t not in seen]
        seen.update(own)
    return tuple(texts)


def config_action_texts(config) -> tuple[str, ...] | None:
    """The run config's constrained action texts (of `env.tasks`), or None when `model.constrained_actions` is off."""
    return action_texts(env_specs(config.env.tasks)) if config.model.constrained_actions else None


def response_texts(texts) -> list[str]:
    """The whole response a constrained policy emits for each action text (the end token follows)."""
    return [RESPONSE_PREFIX + text for text in texts]
