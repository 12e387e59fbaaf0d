"""Scripted demonstrations (oracle episodes recorded as the worker prompts them) and the SFT step on them."""

import numpy as np
import pytest

from jaxwebrl.env.agent.actions import format_call, parse_action
from jaxwebrl.env.agent.prompt import PromptConfig
from jaxwebrl.eval.demos import oracle_demonstrations, response_text, snap_click
from jaxwebrl.eval.sft import decision_rows, demo_rows, pad_rows, sft_train
from jaxwebrl.models.config import tiny_config
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.env.agent.action_space import CLICK_GRID, RESPONSE_PREFIX
from jaxwebrl.rollout.action_grammar import action_constraint

SHORT = PromptConfig(window=0, system_prompt="Press the buttons of the pattern. Answer: Memory: {} then Action.")


def test_toy_demonstrations_are_the_oracle_path_in_worker_prompts():
    demos = oracle_demonstrations(["toy"], range(4), prompt=SHORT, env_options={"screenshot_size": (64, 64)})
    assert len(demos) == 12                                  # 4 won episodes x 3 turns
    pattern_c = [d["response"].split("Action: ")[1] for d in demos if d["seed"] == 2]
    assert pattern_c == ["click(750, 500)", "click(250, 500)", "click(750, 500)"]   # C = [1, 0, 1]
    assert all(d["response"].startswith("Memory: {}\nAction: ") for d in demos)
    last = demos[2]["messages"][-1]["content"]
    assert last[-1]["text"].startswith("Step 3 of at most 3.") and len(demos[2]["images"]) == 1


def test_an_episode_whose_env_fails_is_dropped_not_lost_and_a_task_that_always_fails_raises(monkeypatch):
    import jaxwebrl.eval.demos as demos_module
    from jaxwebrl.env.base import EnvFailure

    made = []

    def failing_on(bad_seeds):
        def make_env(task, **options):
            env = real_make_env(task, **options)
            real_reset = env.reset

            def reset(seed):
                if seed in bad_seeds:
                    raise EnvFailure(f"judge timed out on seed {seed}")
                return real_reset(seed)
            env.reset = reset
            made.append(env)
            return env
        return make_env

    real_make_env = demos_module.make_env
    options = {"screenshot_size": (64, 64)}
    monkeypatch.setattr(demos_module, "make_env", failing_on({1}))
    demos = oracle_demonstrations(["toy"], range(4), prompt=SHORT, env_options=options)
    assert sorted({d["seed"] for d in demos}) == [0, 2, 3] and len(made) == 2   # seed 1 dropped, the env rebuilt
    monkeypatch.setattr(demos_module, "make_env", failing_on({0, 1}))
    with pytest.raises(EnvFailure, match="seed 1"):
        oracle_demonstrations(["toy"], range(2), prompt=SHORT, env_options=options)


def test_call_text_parses_back():
    for text in ["click(12, 900)", 'type(text="a \\"b\\"")', 'key("Enter")']:
        action = parse_action(text)
        assert parse_action(format_call(action)) == parse_action(format_call(parse_action(format_call(action))))
        assert format_call(action) == text
    assert response_text(parse_action("click(1, 2)"), "tool_call").startswith("Memory: {}\nAction: <tool_call>")


@pytest.mark.slow
def test_sft_fits_the_demonstrations():
    policy = tiny_policy(seed=0)
    demos = oracle_demonstrations(["toy"], range(4), prompt=SHORT, env_options={"screenshot_size": (64, 64)})
    rows = demo_rows(demos, policy.processor)
    ids, attention, loss_mask, pixels, grid = pad_rows(rows[:2])
    assert ids.shape[1] % 64 == 0 and len(grid) == 2 and loss_mask.sum() == sum(r["loss_mask"].sum() for r in rows[:2])
    response = rows[0]["input_ids"][rows[0]["loss_mask"] > 0]
    assert response[-1] == policy.processor.tokenizer.eos_token_id
    assert policy.processor.decode(response[:-1]) == demos[0]["response"]
    _, losses = sft_train(policy, rows, steps=12, batch_size=4, lr=1e-2)
    assert np.mean(losses[-3:]) < 0.5 * np.mean(losses[:3])


def test_snap_click_picks_the_nearest_allowed_click_and_refuses_other_kinds():
    assert format_call(snap_click(parse_action("click(101, 949)"), CLICK_GRID)) == "click(150, 950)"
    assert format_call(snap_click(parse_action("click(0, 0)"), CLICK_GRID)) == "click(50, 50)"
    with pytest.raises(ValueError, match="miniwob/enter-text: the oracle needs a 'type' action"):
        snap_click(parse_action('type(text="x")'), CLICK_GRID, "miniwob/enter-text")


def test_snapped_miniwob_demonstrations_hold_only_emittable_clicks_and_decisions_carry_the_loss():
    prompt = PromptConfig(window=0, system_prompt="Click.")
    demos = oracle_demonstrations(["miniwob/click-tab"], range(3), prompt=prompt, action_texts=CLICK_GRID,
                                  env_options={"screenshot_size": (112, 140), "max_steps": 5})
    assert len(demos) == 3 and {d["seed"] for d in demos} == {0, 1, 2}         # the snapped oracle wins each
    assert all(d["response"][len(RESPONSE_PREFIX):] in CLICK_GRID for d in demos)
    assert demos[0]["images"][0].shape == (140, 112, 3)
    processor = tiny_processor()
    rows = demo_rows(demos, processor)
    constraint = action_constraint(processor, CLICK_GRID, tiny_config().text.vocab_size)
    for row, decided in zip(rows, decision_rows(rows, constraint)):
        response = row["input_ids"][row["loss_mask"] > 0]
        chosen = row["input_ids"][decided["loss_mask"] > 0]
        text = processor.decode(chosen)
        assert 2 <= len(chosen) < len(response) // 4 and text.isdigit()   # digits of x and y, nothing forced
