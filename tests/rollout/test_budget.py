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
