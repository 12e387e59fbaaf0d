"""The one home of the action automaton: the action grammar (`jaxwebrl.env.agent.action_space`) joined with a
tokenizer into the `TokenConstraint` that the policy server's sampler decodes under and that the trainer and the
supervised warm start (eval/sft.py) replay over sampled or demonstrated tokens, so all three restrict the policy
to the same automaton.

    constraint = action_constraint(processor, config_action_texts(config), vocab_size)

(Layer 3: the grammar lives in env and the token engine in models, two layer-2 packages that may not import each
other; train and eval import this module.)
"""

from __future__ import annotations

from jaxwebrl.env.agent.action_space import response_texts
from jaxwebrl.models.constraints import TokenConstraint


def action_constraint(processor, action_texts, vocab_size: int) -> TokenConstraint:
    """The token automaton for `action_texts` under this processor's tokenizer: exactly
    `RESPONSE_PREFIX + text` (`Memory: {}\\nAction: <text>`) + the end token for each text; `allowed [S, V] bool`,
    `next_state [S, V] int32` with V = `vocab_size`."""
    return TokenConstraint.from_texts(processor.tokenizer, response_texts(action_texts), vocab_size)
