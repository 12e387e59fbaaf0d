"""The first step's token budget (template, goal, image tokens, response) against buffer.max_seq_len, before any
browser: counted as the policy server encodes the prompt, refused in one line naming the knob."""

import json

import numpy as np
import pytest

from configs.constT10 import get_config
from jaxwebrl.env.agent.prompt import PromptConfig, build_prompt
from jaxwebrl.errors import CannotTrain
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.budget import check_first_step_fits, first_step_budget
from jaxwebrl.rollout.spec import worker_fields

PROCESSOR = tiny_processor()
GOAL = "Find the blue mug on the second shelf and answer with its price in euros"
SPEC = {"task_id": "local/long-goal", "start_url": "http://127.0.0.1:9/index.html", "max_steps": 4, "goal": GOAL,
        "evaluator": {"type": "answer_match", "answer": "12.50"}}


@pytest.fixture
def spec_config(tmp_path):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(SPEC))
    config = get_config("tiny")
    config.env.tasks = f"miniwob/click-tab,{path}"
    return config


def test_the_budget_counts_the_first_prompt_as_the_policy_server_encodes_it(spec_config):
    config = spec_config
    budget = first_step_budget(config, PROCESSOR)
    prompt = build_prompt(GOAL, [], 0, {},
                          PromptConfig.from_dict(worker_fields(config)["prompt"]), max_steps=4)
    screenshot = np.zeros((config.env.screenshot_height, config.env.screenshot_width, 3), np.uint8)
    encoded = PROCESSOR(prompt.messages, [screenshot])["input_ids"]
    assert budget["task"] == "local/long-goal" and budget["prompt"] == len(encoded)
    assert budget["image"] == PROCESSOR.image_processor.num_image_tokens(*screenshot.shape[:2]) > 0
    assert budget["total"] == len(encoded) + config.model.max_new_tokens


def test_a_first_step_longer_than_max_seq_len_is_refused_in_one_line_naming_the_knob(spec_config):
    config = spec_config
    total = first_step_budget(config, PROCESSOR)["total"]
    config.buffer.max_seq_len = total
    assert check_first_step_fits(config, PROCESSOR)["total"] == total
    config.buffer.max_seq_len = total - 1
    with pytest.raises(CannotTrain, match=f"--config.buffer.max_seq_len={total} or more") as err:
        check_first_step_fits(config, PROCESSOR)
    assert "model.max_new_tokens=" in str(err.value) and "\n" not in str(err.value)


def test_the_long_regimes_last_step_fits_its_row_with_the_longest_memory_and_goal():
    """configs/<recipe>.py:long: step 30 of the hard split (the 4-line summary window, the rest counted), the
    longest memory the free grammar admits and the longest response still fit buffer.max_seq_len."""
    from jaxwebrl.env.agent.action_space import MemoryGrammar, response_text
    from jaxwebrl.env.agent.prompt import StepRecord

    config = get_config("long")
    fields = worker_fields(config)
    prompt_config = PromptConfig.from_dict(fields["prompt"])
    assert prompt_config.max_summary_steps == 4
    memory = {key: "z" * 6 for key in ("details_9", "details_8", "pressed_9")}
    grammar = MemoryGrammar(config.env.memory_max_keys, config.env.memory_value_chars)
    assert grammar.admits(memory)
    response = response_text("click(450, 250)", memory)
    history = [StepRecord(i, response, "click(450, 250)") for i in range(29)]
    goal = "Press " + ", ".join(["yellow"] * 7) + "."
    prompt = build_prompt(goal, history, 29, memory, prompt_config, max_steps=30)
    ids = PROCESSOR.tokenizer.encode(PROCESSOR.render(prompt.messages))
    image = PROCESSOR.image_processor.num_image_tokens(config.env.screenshot_height, config.env.screenshot_width)
    tokens = int((ids != PROCESSOR.image_token_id).sum()) + image * len(prompt.image_refs)
    assert len(PROCESSOR.tokenizer.encode(response, add_special_tokens=False)) + 1 <= config.model.max_new_tokens
    assert tokens + config.model.max_new_tokens <= config.buffer.max_seq_len, tokens
