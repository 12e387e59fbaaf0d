"""What the vLLM policy server hands its engine, checked without the engine: the action grammar as one regex
(exactly the grammar's responses) and prompts with one image placeholder an image (vLLM expands it itself)."""

import re

import numpy as np

from jaxwebrl.env.agent.action_space import CLICK_GRID, MemoryGrammar, response_regex, response_text, response_texts
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.vllm_server import collapse_image_tokens


def test_the_regex_admits_exactly_the_grammars_responses():
    responses = response_texts(CLICK_GRID)
    pattern = re.compile(response_regex(CLICK_GRID))
    assert all(pattern.fullmatch(r) for r in responses)
    for wrong in ("", responses[0] + " ", responses[0][:-1], responses[0].replace("Action", "action"),
                  "Memory: {}\nAction: click(51, 50)"):
        assert pattern.fullmatch(wrong) is None


def test_the_free_memory_regex_is_the_one_the_token_automaton_compiles():
    pattern = re.compile(response_regex(CLICK_GRID, MemoryGrammar()))
    assert pattern.fullmatch(response_text("click(450, 250)", {"done": "2", "notes_3": "abc"}))
    assert pattern.fullmatch(response_text("click(450, 250)")) and not pattern.fullmatch(
        response_text("click(450, 250)", {"done": "2222222"}))


def test_each_images_tokens_become_one_placeholder():
    processor = tiny_processor()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (64, 64, 3), np.uint8), rng.integers(0, 255, (90, 120, 3), np.uint8)]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "then"}, {"type": "image"}]}]
    expanded = processor(messages, images)["input_ids"]
    pad = processor.image_token_id
    collapsed = collapse_image_tokens(expanded, pad)
    assert (expanded == pad).sum() > 2 and (collapsed == pad).sum() == 2
    np.testing.assert_array_equal(collapsed, processor.tokenizer.encode(processor.render(messages)))
