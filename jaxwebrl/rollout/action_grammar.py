"""The one home of the action automaton: the action grammar (`jaxwebrl.env.agent.action_space`) joined with a
tokenizer into the `TokenConstraint` that the policy server's sampler decodes under and that the trainer and the
supervised warm start (eval/sft.py) replay over sampled or demonstrated tokens, so all three restrict the policy
to the same automaton.

    constraint = config_constraint(config, processor, vocab_size)     # None when actions are unconstrained
    constraint = action_constraint(processor, texts, vocab_size, memory=MemoryGrammar())   # free memory

(Layer 3: the grammar lives in env and the token engine in models, two layer-2 packages that may not import each
other; train and eval import this module.)
"""

from __future__ import annotations

from jaxwebrl.env.agent.action_space import MemoryGrammar, config_memory_grammar, response_regex, response_texts
from jaxwebrl.env.registry import config_action_texts
from jaxwebrl.models.constraints import TokenConstraint


def action_constraint(processor, action_texts, vocab_size: int, memory: MemoryGrammar | None = None
                      ) -> TokenConstraint:
    """The token automaton for `action_texts` under this processor's tokenizer, then the end token: with
    `memory` None exactly `RESPONSE_PREFIX + text` (`Memory: {}\\nAction: <text>`) for each text, else every
    response of `response_regex` (the free memory, then a text); `allowed [S, V] bool`, `next_state [S, V] int32`
    with V = `vocab_size`."""
    tokenizer = processor.tokenizer
    if memory is None:
        return TokenConstraint.from_texts(tokenizer, response_texts(action_texts), vocab_size)
    return TokenConstraint.from_regex(response_regex(action_texts, memory), tokenizer.token_strings(vocab_size),
                                      tokenizer.eos_token_id)


def config_constraint(config, processor, vocab_size: int) -> TokenConstraint | None:
    """The run's automaton (`env.tasks`' action texts, `env.memory`'s grammar), or None when
    `model.constrained_actions` is off."""
    texts = config_action_texts(config)
    if texts is None:
        return None
    return action_constraint(processor, texts, vocab_size, memory=config_memory_grammar(config))
