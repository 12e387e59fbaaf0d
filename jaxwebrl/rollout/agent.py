"""The agent of one browser step: observation + history + memory -> prompt -> policy reply -> memory + action.

    agent = Agent(client, PromptConfig.from_dict(...), max_new_tokens=256)
    turn = agent.act(obs.goal, history, tracker, ref, max_steps=env.max_steps, seed=..., group=(worker, group))
    feedback = agent.observe(turn, result.info, history, ref)     # after env.step(turn.action); extends history

`act` builds the prompt (`env.prompt`), asks the policy client, and parses the reply into the memory the agent
keeps (`env.memory`, updated in `tracker`) and an action (`env.actions`); it returns a typed `AgentTurn`.
`observe` judges the action against what the environment said and appends the step to the history the next prompt
shows. The loop around it (environment, buffer, failures, stats) is `rollout/worker.py`.
"""

from __future__ import annotations

import dataclasses
import time

from jaxwebrl.env.agent.actions import Action, parse_action
from jaxwebrl.env.agent.memory import MemoryStats, MemoryTracker, format_memory, split_memory
from jaxwebrl.env.agent.prompt import (PromptConfig, Prompt, StepRecord, build_prompt, cut_text, prompt_excerpt,
                                 summarize_action)


@dataclasses.dataclass(frozen=True)
class AgentTurn:
    """One step's reply: the prompt, the policy's generation (tokens, log-probs, versions, timing), the memory
    stats after it, the parsed action, and the seconds spent building the prompt and waiting for the policy."""

    prompt: Prompt
    generation: object          # rollout.client.Generation
    memory: MemoryStats
    action: Action
    prompt_s: float
    generate_s: float


@dataclasses.dataclass(frozen=True)
class Feedback:
    """What the agent learnt from the environment about its action: invalid (malformed or refused), and the
    text the next prompt shows (None when there is nothing to say)."""

    invalid: bool
    text: str | None


class Agent:
    """Prompts the policy and parses its replies (see the module docstring).

    client: has ``generate(messages, image_refs, *, max_new_tokens, temperature, top_p, seed, group) -> Generation``.
    """

    def __init__(self, client, prompt_config: PromptConfig, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0):
        self.client = client
        self.prompt_config = prompt_config
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p

    def act(self, goal: str, history: list[StepRecord], tracker: MemoryTracker, screenshot_ref: int, *,
            max_steps: int, seed: int | None, group) -> AgentTurn:
        """Prompt from the goal, the history and the memory; the policy's reply; memory (updated in `tracker`)
        and action parsed from it. Transport errors propagate (the worker decides what they cost)."""
        t0 = time.perf_counter()
        prompt = build_prompt(goal, history, screenshot_ref, tracker.memory, self.prompt_config, max_steps=max_steps)
        t1 = time.perf_counter()
        generation = self.client.generate(prompt.messages, prompt.image_refs, max_new_tokens=self.max_new_tokens,
                                          temperature=self.temperature, top_p=self.top_p, seed=seed, group=group)
        t2 = time.perf_counter()
        memory = tracker.update(generation.text)
        _, action_text = split_memory(generation.text)
        return AgentTurn(prompt=prompt, generation=generation, memory=memory, action=parse_action(action_text),
                         prompt_s=t1 - t0, generate_s=t2 - t1)

    def observe(self, turn: AgentTurn, env_info: dict, history: list[StepRecord], screenshot_ref: int) -> Feedback:
        """Judges the action by the environment's `info` (invalid_action, action_error) and appends the step to
        `history`."""
        invalid = (not turn.action.is_valid) or bool(env_info.get("invalid_action", False))
        error = turn.action.error if not turn.action.is_valid else env_info.get("action_error")
        text = f"invalid action: {error}" if invalid else (str(error) if error else None)
        history.append(StepRecord(screenshot_ref, turn.generation.text, summarize_action(turn.action), text))
        return Feedback(invalid=invalid, text=text)


def step_texts(turn: AgentTurn, feedback: Feedback, tracker: MemoryTracker, max_chars: int) -> dict:
    """What a trajectory viewer shows of one step, each text cut to `max_chars`: the prompt excerpt, the model's
    response, the action, the feedback and the memory after it."""
    return {"prompt": prompt_excerpt(turn.prompt), "response": cut_text(turn.generation.text, max_chars),
            "action": summarize_action(turn.action), "feedback": cut_text(feedback.text or "", max_chars),
            "memory": cut_text(format_memory(tracker.memory), max_chars)}
