"""The first step's token budget against the buffer's row width, checked before any browser starts.

    budget = first_step_budget(config, processor)    # {"prompt": P, "image": I, "response": R, "total": P + R, ...}
    check_first_step_fits(config, processor)         # CannotTrain (one line, the knobs) when total > max_seq_len

A step row holds prompt + response (`buffer.max_seq_len`). The first step's prompt is the chat template of the
system text, the goal, the step line and the empty memory, with one screenshot (its image tokens at
`env.screenshot_*`, no summary yet); the response may take `model.max_new_tokens`. A run whose first step cannot
fit never trains (every episode would fail before its first step), so the run refuses to start. The goal of a
MiniWoB++ or registered task is only known once its page loads: the check then counts an empty goal (a lower
bound); a JSON spec's own goal is counted. Later steps grow (summary, window): those are cut by the worker,
counted, and stop the run when all are (`train.stop_after_unusable_episodes`).
"""

from __future__ import annotations

from jaxwebrl.env.agent.prompt import PromptConfig, build_prompt
from jaxwebrl.env.registry import check_env_spec, env_specs, task_horizon
from jaxwebrl.env.tasks.webtask.task_spec import WebTaskSpec
from jaxwebrl.errors import CannotTrain
from jaxwebrl.rollout.spec import worker_fields


def first_step_budget(config, processor) -> dict:
    """The largest first step of the run's tasks: {"task", "prompt" (tokens, image tokens included), "image"
    (tokens of the one screenshot), "response" (model.max_new_tokens), "total"}."""
    fields = worker_fields(config)
    prompt_config = PromptConfig.from_dict(fields["prompt"])
    image = processor.image_processor.num_image_tokens(config.env.screenshot_height, config.env.screenshot_width)
    worst = None
    for spec in env_specs(config.env.tasks):
        checked = check_env_spec(spec)
        goal = checked.goal if isinstance(checked, WebTaskSpec) else ""
        task = checked.task_id if isinstance(checked, WebTaskSpec) else str(checked)
        prompt = build_prompt(goal, [], 0, {}, prompt_config,
                              max_steps=task_horizon(checked, config.env.max_episode_steps))
        text_ids = processor.tokenizer.encode(processor.render(prompt.messages))
        tokens = int((text_ids != processor.image_token_id).sum()) + image * len(prompt.image_refs)
        if worst is None or tokens > worst["prompt"]:
            worst = {"task": task, "prompt": tokens, "image": image}
    response = int(config.model.max_new_tokens)
    return dict(worst, response=response, total=worst["prompt"] + response)


def check_first_step_fits(config, processor) -> dict:
    """`first_step_budget`, or CannotTrain naming the tokens and the knobs when it exceeds `buffer.max_seq_len`."""
    budget = first_step_budget(config, processor)
    limit = int(config.buffer.max_seq_len)
    if budget["total"] > limit:
        raise CannotTrain(
            f"the first step of {budget['task']} needs {budget['total']} tokens (prompt {budget['prompt']}, of them "
            f"{budget['image']} for the {config.env.screenshot_width}x{config.env.screenshot_height} screenshot, + "
            f"model.max_new_tokens={budget['response']}) but a step row holds buffer.max_seq_len={limit}: set "
            f"--config.buffer.max_seq_len={budget['total']} or more (or shrink env.screenshot_*, the system prompt, "
            f"model.max_new_tokens)")
    return budget
