"""The action automaton (rollout/action_grammar.py: the grammar of env/agent/action_space.py under a tokenizer) the
tiny policy decodes under and the trainer replays: states, decisions, fallback."""

import numpy as np
import pytest

from jaxwebrl.env.agent.action_space import CLICK_GRID, RESPONSE_PREFIX
from jaxwebrl.env.registry import action_texts
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.action_grammar import action_constraint


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


def _row(processor, prompt: str, response: str, width: int):
    """(input_ids [width], loss_mask [width]): prompt tokens, response tokens + end token, padding."""
    tok = processor.tokenizer
    p = tok.encode(prompt, add_special_tokens=False).tolist()
    r = tok.encode(response, add_special_tokens=False).tolist() + [tok.eos_token_id]
    ids = np.zeros(width, np.int32)
    mask = np.zeros(width, np.int32)
    ids[:len(p) + len(r)] = p + r
    mask[len(p):len(p) + len(r)] = 1
    return ids, mask


def test_toy_responses_have_one_decision_and_foreign_rows_fall_back(processor):
    texts = action_texts(["toy"])
    assert texts == ("click(250, 500)", "click(750, 500)")
    constraint = action_constraint(processor, texts, processor.tokenizer.vocab_size)
    rows = [_row(processor, "user: go", RESPONSE_PREFIX + "click(750, 500)", 64),
            _row(processor, "user: go", RESPONSE_PREFIX + "click(250, 500)", 64),
            _row(processor, "user: go", 'Memory: {"a": 1}\nAction: click(250, 500)', 64)]  # not in the grammar
    ids, mask = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    states, admitted = constraint.replay(ids, mask)
    assert admitted.tolist() == [True, True, False]
    assert (states[:2][mask[:2] == 0] == -1).all() and (states[:2][mask[:2] == 1] >= 0).all()
    assert (states[2] == -1).all()
    decisions = constraint.decision_mask(states, mask, admitted)
    tok = processor.tokenizer
    for b, digit in ((0, "7"), (1, "2")):   # the one choice: which button
        assert decisions[b].sum() == 1 and tok.decode(ids[b][decisions[b] == 1].tolist()) == digit
    np.testing.assert_array_equal(decisions[2], mask[2])   # outside the grammar: every policy token


def test_click_grid_decisions_are_the_two_coordinates(processor):
    constraint = action_constraint(processor, CLICK_GRID, processor.tokenizer.vocab_size)
    ids, mask = _row(processor, "user: go", RESPONSE_PREFIX + "click(350, 950)", 80)
    states, admitted = constraint.replay(ids[None], mask[None])
    decisions = constraint.decision_mask(states, mask[None], admitted)
    assert admitted.all() and processor.tokenizer.decode(ids[decisions[0] == 1].tolist()) == "39"
