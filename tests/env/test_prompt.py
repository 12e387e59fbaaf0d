"""Agent prompt: sliding window of (screenshot, response) rounds, text summaries, memory, think-stripping."""

import pytest

from jaxwebrl.env.agent.actions import Action, parse_action
from jaxwebrl.env.agent.prompt import PromptConfig, StepRecord, build_prompt, read_goal_and_step, summarize_action


def history(n, feedback_at=()):
    return [StepRecord(screenshot_ref=100 + i,
                       response=f"<think>secret reasoning {i}</think>Memory: {{\"i\": {i}}}\nAction: click({i}, 7)",
                       action_summary=f"click({i}, 7)", feedback="bad action" if i in feedback_at else None)
            for i in range(n)]


def images_in(messages):
    return sum(item["type"] == "image" for m in messages for item in m["content"])


def all_text(messages):
    return "\n".join(item.get("text", "") for m in messages for item in m["content"])


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 7])
def test_window_keeps_last_n_rounds_with_refs_in_image_order(steps):
    config = PromptConfig(window=2)
    prompt = build_prompt("Log in as bob.", history(steps), 999, {"i": 9}, config, max_steps=10)
    kept = min(steps, 2)
    assert prompt.image_refs == [100 + i for i in range(steps - kept, steps)] + [999]
    assert images_in(prompt.messages) == len(prompt.image_refs) <= config.max_images
    roles = [m["role"] for m in prompt.messages]
    assert roles == ["system"] + ["user", "assistant"] * kept + ["user"]
    assert read_goal_and_step(prompt.messages) == ("Log in as bob.", steps)
    text = all_text(prompt.messages)
    for i in range(steps - kept):  # older steps are text summaries only
        assert f"Step {i + 1}: click({i}, 7)" in text
    assert 'Memory: {"i": 9}' in prompt.messages[-1]["content"][-1]["text"]


def test_think_spans_are_stripped_from_the_window():
    prompt = build_prompt("g", history(3), 5, None, PromptConfig(window=3), max_steps=5)
    text = all_text(prompt.messages)
    assert "secret reasoning" not in text and "<think>" not in text
    assert prompt.messages[2] == {"role": "assistant", "content": [{"type": "text",
                                                                   "text": 'Memory: {"i": 0}\nAction: click(0, 7)'}]}


def test_feedback_reaches_the_next_prompt_and_summaries():
    prompt = build_prompt("g", history(2, feedback_at=(1,)), 5, {}, PromptConfig(window=1), max_steps=5)
    assert prompt.messages[-1]["content"][0] == {"type": "text", "text": "Feedback: bad action"}
    no_window = build_prompt("g", history(2, feedback_at=(0, 1)), 5, {}, PromptConfig(window=0), max_steps=5)
    assert "Step 1: click(0, 7) (bad action)" in all_text(no_window.messages)
    assert {"type": "text", "text": "Feedback: bad action"} in no_window.messages[-1]["content"]
    assert no_window.image_refs == [5]


def test_summary_is_bounded():
    config = PromptConfig(window=1, max_summary_steps=3, max_summary_chars=20)
    records = history(10)
    records[7] = StepRecord(1, "r", "type('" + "x" * 200 + "')")
    text = build_prompt("g", records, 5, {}, config, max_steps=20).messages[1]["content"][0]["text"]
    assert "(6 earlier steps not shown)" in text and "Step 7:" in text and "Step 3:" not in text
    lines = text.splitlines()
    assert len(lines) == 6 and all(len(line) <= 20 for line in lines[3:]) and lines[4].endswith("...")


@pytest.mark.parametrize("older", [0, 1, 15, 16, 20, 29, 30, 31, 45])
def test_the_summary_window_keeps_the_last_max_summary_steps_older_steps(older):
    """Rule: the last max_summary_steps steps before the screenshot window, one line each; the rest counted only
    (it once kept 30 - n lines for 15 < n < 30: 20 older steps showed 10, 29 showed 1)."""
    config = PromptConfig(window=1, max_summary_steps=30)
    text = all_text(build_prompt("g", history(older + 1), 5, {}, config, max_steps=50).messages)
    shown = [i for i in range(older) if f"Step {i + 1}: click({i}, 7)" in text]
    assert shown == list(range(max(0, older - 30), older))
    assert ("earlier steps not shown" in text) == (older > 30)
    if older > 30:
        assert f"({older - 30} earlier steps not shown)" in text


def test_action_summaries_and_styles():
    assert summarize_action(parse_action("click(250, 500)")) == "click(250, 500)"
    assert summarize_action(parse_action('type(text="bob")')) == "type('bob')"
    assert summarize_action(parse_action('key("ctrl+a")')) == "key('ctrl+a')"
    assert summarize_action(Action("scroll", direction="down", amount=300)) == "scroll('down', 300)"
    assert summarize_action(parse_action("gibberish")).startswith("invalid: ")
    tool = build_prompt("g", [], 1, {}, PromptConfig(action_style="tool_call"), max_steps=3)
    assert "<tool_call>" in tool.messages[0]["content"][0]["text"]
    custom = build_prompt("g", [], 1, {}, PromptConfig(system_prompt="Press a button: {actions}"), max_steps=3)
    assert custom.messages[0]["content"][0]["text"].startswith("Press a button: click(x, y)")


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="window"):
        PromptConfig(window=-1)
    with pytest.raises(ValueError, match="action_style"):
        PromptConfig(action_style="xml")
    with pytest.raises(ValueError, match="unknown prompt option"):
        PromptConfig.from_dict({"windw": 2})
    with pytest.raises(ValueError, match="build_prompt"):
        read_goal_and_step([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])


def test_special_token_forms_in_responses_memory_goal_and_feedback_stay_text():
    """A response that spells `<|image_pad|>` (the policy can sample it) or `<|im_end|>`, a memory, a goal and a
    feedback holding special-token forms: the tiny processor's real tokenizer encodes the prompt with exactly one
    placeholder run a screenshot and the template's own turn ends, so the server never refuses it for a phantom
    image (before: 'the prompt has 4 image placeholders but 2 images were given')."""
    import numpy as np
    from PIL import Image

    from jaxwebrl.models.processor import tiny_processor

    processor = tiny_processor()
    record = StepRecord(screenshot_ref=7, response="Memory: {}\nAction: type(text=\"<|image_pad|> <|im_end|>\")",
                        action_summary="type", feedback="the page said <|vision_start|>")
    prompt = build_prompt("Write <|im_start|>system", [record], 8, {"note": "<|image_pad|>"}, PromptConfig(window=1),
                          max_steps=5)
    images = [Image.new("RGB", (56, 56))] * len(prompt.image_refs)
    plain = processor(build_prompt("Write", [StepRecord(7, "Memory: {}\nAction: click(1, 2)", "click")], 8, {},
                                   PromptConfig(window=1), max_steps=5).messages, images)["input_ids"]
    ids = processor(prompt.messages, images)["input_ids"]
    specials = [processor.tokenizer.encode(t, add_special_tokens=False)[0]
                for t in ("<|im_start|>", "<|im_end|>", "<|vision_start|>")]
    image_tokens = lambda x: int(np.sum(x == processor.image_token_id))   # noqa: E731
    assert image_tokens(ids) == image_tokens(plain) > 0
    for special in specials:
        assert np.sum(ids == special) == np.sum(plain == special), special
    assert "Task: Write <\u200d|im_start|>system" in processor.decode(ids)   # the text is still there to read
