"""Scripted demonstrations for a supervised warm start: the environments' oracles play, the agent's prompt is
recorded exactly as a rollout worker builds it, and the oracle's action becomes the target response.

    steps = oracle_demonstrations(["miniwob/click-test", "toy"], seeds=range(100), prompt=PromptConfig(window=0))
    steps[0] == {"task", "spec", "seed", "step", "messages", "images": [uint8 [H, W, 3]], "response": str}

Responses are `Memory: {}` + `Action: <text>` in the prompt's action style (short call text such as
`click(250, 500)` for "call", the tool-call JSON for "tool_call"): the minimal memory the paper favours. With a
free memory grammar (`memory=`, env.memory "free") the oracle writes the memory it keeps, `{"done": "<n>"}`
after its n-th action (the progress a recall page does not show), and the agent's next prompt carries it, as a
rollout worker's does. Only episodes the oracle wins are kept; an episode whose environment fails (`EnvFailure`: a
crashed browser, a judge that timed out) is neither won nor lost: it is dropped with a count, the env rebuilt, and a
task whose every episode failed so raises its last failure. Each task's oracle is its family's
(`jaxwebrl.env.registry.task_oracle`; a spec without one is refused): the chain family's reads only the goal and
the screenshots (plus, in its recall variant, its own press count); MiniWoB++ tasks have one where
`jaxwebrl.env.tasks.miniwob.oracles.oracle_tasks()` lists them.

`action_texts` (a constrained policy's action space, `jaxwebrl.env.registry.config_action_texts`) snaps
every oracle click to the nearest allowed click, and that snapped click is what is played and recorded, so the
demonstrations hold only responses the constrained policy can emit (an episode the snapped oracle loses is
dropped like any other).
"""

from __future__ import annotations

import logging
from typing import Iterable

import numpy as np

from jaxwebrl.env.agent import action_space
from jaxwebrl.env.agent.actions import Action, format_action, format_call, parse_action
from jaxwebrl.env.agent.prompt import PromptConfig, StepRecord, build_prompt, summarize_action
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.registry import make_env, task_oracle

log = logging.getLogger(__name__)


def response_text(action: Action, action_style: str, memory: dict | None = None) -> str:
    """The demonstration's response: the memory (`{}` when None), then the action in the prompt's style."""
    text = format_call(action) if action_style == "call" else format_action(action)
    if parse_action(text).kind != action.kind:
        raise ValueError(f"{text!r} does not parse back to a {action.kind} action")
    return action_space.response_text(text, memory)


def oracle_memory(actions_taken: int) -> dict:
    """What the oracle remembers after its `actions_taken`-th action: how many it has made."""
    return {"done": str(actions_taken)}


def snap_click(action: Action, action_texts, task_id: str = "") -> Action:
    """The click of `action_texts` nearest (Euclidean, 0-1000 space) to the click `action`; any action whose call
    text is one of `action_texts` (a WebGym task's `answer("...")`) as it is.

    Raises ValueError for any other action: a constrained policy cannot emit it, so the task does not suit it
    (choose click-only tasks)."""
    if action.kind != "click" and format_call(action) in action_texts:
        return action
    if action.kind != "click":
        raise ValueError(f"{task_id or 'the task'}: the oracle needs a {action.kind!r} action, which the constrained "
                         f"action space (clicks only) cannot express; choose click-only tasks or turn "
                         f"model.constrained_actions off")
    clicks = [a for a in (parse_action(t) for t in action_texts) if a.kind == "click"]
    if not clicks:
        raise ValueError("action_texts holds no click: nothing to snap a click to")
    return min(clicks, key=lambda c: (c.x - action.x) ** 2 + (c.y - action.y) ** 2)


def play_demonstration(env, oracle, seed: int, prompt: PromptConfig, action_texts=None,
                       memory: action_space.MemoryGrammar | None = None) -> tuple[list[dict], float]:
    """One episode of `oracle` (`jaxwebrl.env.families.Oracle`) on `env` (clicks snapped to `action_texts` when
    given; the oracle's memory written when `memory` is given): its steps (see module docstring) and the final
    reward."""
    obs = env.reset(seed)
    images: list[np.ndarray] = []
    history: list[StepRecord] = []
    steps: list[dict] = []
    kept: dict = {}   # the memory the oracle wrote last (the next prompt shows it)
    while True:
        images.append(np.asarray(obs.screenshot, np.uint8).copy())
        p = build_prompt(obs.goal, history, len(images) - 1, kept, prompt, max_steps=env.max_steps)
        action = oracle(env, obs, len(steps))
        if action_texts is not None:
            action = snap_click(action, action_texts, env.task_id)
        if memory is not None:
            kept = oracle_memory(len(steps) + 1)
            if not memory.admits(kept):
                raise ValueError(f"the oracle's memory {kept} is outside the memory grammar {memory}: widen "
                                 f"env.memory_value_chars")
        response = response_text(action, prompt.action_style, kept)
        steps.append({"task": env.task_id, "seed": int(seed), "step": len(steps), "messages": p.messages,
                      "images": [images[r] for r in p.image_refs], "response": response})
        result = env.step(action)
        error = result.info.get("action_error")
        history.append(StepRecord(len(images) - 1, response, summarize_action(action), str(error) if error else None))
        if result.terminated or result.truncated or len(steps) >= env.max_steps:
            return steps, float(result.reward)
        obs = result.observation


def oracle_demonstrations(tasks: Iterable[str], seeds: Iterable[int], *, prompt: PromptConfig | None = None,
                          env_options: dict | None = None, action_texts=None,
                          memory: action_space.MemoryGrammar | None = None) -> list[dict]:
    """Steps of the oracle's winning episodes on every (task, seed); see the module docstring."""
    prompt = prompt or PromptConfig()
    seeds = list(seeds)
    out: list[dict] = []
    for task in tasks:
        oracle = task_oracle(task)
        env = make_env(task, **(env_options or {}))
        failures: list[EnvFailure] = []
        try:
            for seed in seeds:
                try:
                    steps, reward = play_demonstration(env, oracle, int(seed), prompt, action_texts, memory)
                except EnvFailure as err:   # not the oracle's loss: drop the episode, start a fresh env
                    failures.append(err)
                    env.close()
                    env = make_env(task, **(env_options or {}))
                    continue
                if reward > 0:   # "task": the env's own name; "spec": the spec as given (its options in any order)
                    out.extend({**step, "spec": task} for step in steps)
        finally:
            env.close()
        if failures and len(failures) == len(seeds):
            raise failures[-1]
        if failures:
            log.warning("%s: %d of %d demonstration episodes dropped, their environment failed (last: %s)",
                        task, len(failures), len(seeds), failures[-1])
    return out
