"""An episode read back from the buffer, as a person looks at it: per step the screenshot the policy answered,
the prompt excerpt, the model's response, the memory, the action, the feedback and the reward; per episode
the outcome and, when it did not succeed, why.

    view = episode_view(episode)                      # an Episode as RingBuffer.read returns it
    image = buffer.screenshots.get(view.steps[0].screenshot_ref)   # uint8 [H, W, 3]

The texts come from the worker's `info["steps"]` (`jaxwebrl.rollout.worker`); an episode recorded without them
(an older buffer) shows empty texts. Every text here is model- or page-provided: escape it before display.
"""

from __future__ import annotations

import dataclasses

from jaxwebrl.buffer.episode import Episode

SUCCESS, FAILURE, ENV_FAILED = "success", "failure", "env_failed"
OUTCOMES = (SUCCESS, FAILURE, ENV_FAILED)


@dataclasses.dataclass(frozen=True)
class StepView:
    index: int
    screenshot_ref: int        # the step's current screenshot (global ref), -1 when the step has none
    prompt: str
    response: str
    memory: str
    action: str
    feedback: str
    reward: float | None       # the episode's reward on its last step; None before (the reward is terminal)
    invalid: bool


@dataclasses.dataclass(frozen=True)
class EpisodeView:
    episode_id: int
    task_id: str
    seed: int | None
    reward: float
    outcome: str               # one of OUTCOMES
    failure_reason: str        # "" for a success
    steps: list[StepView]


def episode_view(episode: Episode) -> EpisodeView:
    """The view of one episode (see module docstring); each step's refs are -1 padded, the current screenshot
    last."""
    info = episode.info
    texts = info.get("steps") or []
    invalid = info.get("invalid_actions") or []
    steps = []
    for j, step in enumerate(episode.steps):
        valid = step.screenshot_refs[step.screenshot_refs >= 0]
        step_texts = texts[j] if j < len(texts) and isinstance(texts[j], dict) else {}
        steps.append(StepView(
            index=j, screenshot_ref=int(valid[-1]) if valid.size else -1,
            prompt=str(step_texts.get("prompt", "")), response=str(step_texts.get("response", "")),
            memory=str(step_texts.get("memory", "")), action=str(step_texts.get("action", "")),
            feedback=str(step_texts.get("feedback", "")),
            reward=episode.reward if j == episode.num_steps - 1 else None,
            invalid=bool(invalid[j]) if j < len(invalid) else False))
    outcome = ENV_FAILED if episode.env_failed else (SUCCESS if episode.reward > 0 else FAILURE)
    return EpisodeView(episode_id=-1 if episode.episode_id is None else episode.episode_id,
                       task_id=episode.task_id, seed=info.get("instance_seed"), reward=episode.reward,
                       outcome=outcome, failure_reason=failure_reason(episode, outcome, steps), steps=steps)


def failure_reason(episode: Episode, outcome: str, steps: list[StepView]) -> str:
    """Why an episode did not succeed, in one line ("" for a success)."""
    if outcome == SUCCESS:
        return ""
    if outcome == ENV_FAILED:
        return f"environment failed: {episode.info.get('env_failure') or 'unknown error'}"
    if episode.cut:
        cut = episode.info.get("cut") or {}
        return (f"cut before step {cut.get('step')}: {cut.get('tokens')} tokens > buffer.max_seq_len="
                f"{cut.get('max_seq_len')} (not trained)")
    last = steps[-1] if steps else None
    if last is not None and last.invalid:
        return f"last action invalid: {last.feedback or last.action}"
    if episode.truncated:
        return f"no success within {len(steps)} steps (step budget reached)"
    return f"episode ended with reward {episode.reward:g}" + (
        f" after {last.action}" if last is not None and last.action else "")
