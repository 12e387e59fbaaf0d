"""One scripted episode: a family's oracle (`jaxwebrl.env.families.Oracle`) plays an env until it ends.

    result = run_episode(env, seed=0, oracle=registry.task_oracle(spec))
    result == {"success", "reward", "steps", "invalid_actions", "truncated", "step_seconds"}

The oracle's action goes through `format_action` and the env's parser, so driving an env through its oracle also
exercises the action language end to end.
"""

from __future__ import annotations

import time

from jaxwebrl.env.agent.actions import format_action


class OracleError(RuntimeError):
    """The page is not in a state the oracle understands (a changed task or a broken page)."""


def run_episode(env, seed: int, oracle) -> dict:
    """Reset env with seed and let `oracle` act until the episode ends; returns the outcome and timings."""
    observation = env.reset(seed)
    steps, invalid, step_seconds = 0, 0, []
    while True:
        text = format_action(oracle(env, observation, steps))
        t0 = time.perf_counter()
        result = env.step(text)
        step_seconds.append(time.perf_counter() - t0)
        steps += 1
        invalid += int(result.info["invalid_action"])
        observation = result.observation
        if result.done:
            success = result.info.get("success", result.reward > 0)   # an env that reports none: reward > 0
            return {"success": bool(success), "reward": result.reward, "steps": steps, "invalid_actions": invalid,
                    "truncated": result.truncated, "step_seconds": step_seconds}
