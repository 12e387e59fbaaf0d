"""A WebGym task in Chromium scored by a judge: the JSON web-task env, plus the screenshots the agent saw and, when
the episode ends (an answer, or the last step), a `judge.py` verdict on the rubric as its reward.

    env = make_env("webgym:tasks.jsonl:3", judge={"backend": "chat", "url": "http://127.0.0.1:8000/v1",
                                                  "model": "Qwen/Qwen3-VL-8B", "api_key_env": "JUDGE_API_KEY"})

StepResult.info of the last step holds `verdict` ([criterion, met] pairs), `judge_raw` (the judge's own answer),
`judge_backend`, `judge_s`, `judged_steps` and `judge_request` (`verdicts.verdict_info`). A `JudgeFailure`
propagates from `step`: it is an `EnvFailure`, so the rollout worker drops the episode and counts it, never scoring
it 0. With `hand_off_verdicts=True` (the rollout worker's envs) the last step does not wait: its StepResult carries
`pending_reward`, a Future of (reward, that info) or of the JudgeFailure, and the browser is free for its next
episode.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
from typing import Any, Mapping

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.tasks.webgym.judge import MAX_SCREENSHOTS, JudgePool, JudgeRequest, make_judge
from jaxwebrl.env.tasks.webgym.verdicts import verdict_info
from jaxwebrl.env.tasks.webgym.webgym_tasks import WebGymTask
from jaxwebrl.env.tasks.webtask.task_spec import WebTaskSpec
from jaxwebrl.env.tasks.webtask.webtask import WebTaskEnv


def judge_pool(settings: Mapping[str, Any] | None) -> JudgePool:
    """The process's one pool of the judge a run's `env.judge` names (None or backend "ground_truth": the
    programmatic answer): every env of a worker process judges through it, so its concurrency and rate limit hold
    for the process."""
    return _pool(json.dumps(dict(settings or {}), sort_keys=True))


@functools.lru_cache(maxsize=None)
def _pool(settings_json: str) -> JudgePool:
    settings = json.loads(settings_json)
    return JudgePool(make_judge(settings), concurrency=int(settings.get("concurrency", 8)),
                     rate_per_s=settings.get("rate_per_s"))


class WebGymEnv(WebTaskEnv):
    """One WebGym task (`task`, played as `spec`) whose reward is the verdict of `judges` (a JudgePool; see the
    module docstring); `hand_off_verdicts`: the last step carries the verdict as a Future instead of waiting."""

    def __init__(self, spec: WebTaskSpec, task: WebGymTask, judges: JudgePool, *, hand_off_verdicts: bool = False,
                 **options):
        super().__init__(spec, **options)
        self.task, self.judges, self.hand_off_verdicts = task, judges, bool(hand_off_verdicts)
        self._seen: list = []
        self._pending: concurrent.futures.Future | None = None

    def reset(self, seed: int):
        self._seen = []
        return super().reset(seed)

    def step(self, action):
        self._pending = None
        result = super().step(action)
        return result if self._pending is None else dataclasses.replace(result, pending_reward=self._pending)

    def _observe(self):
        observation = super()._observe()
        self._seen = (self._seen + [observation.screenshot])[-MAX_SCREENSHOTS:]
        return observation

    def _judge(self, action: Action, last_step: bool) -> tuple[float, bool, dict]:
        answered = action.kind == "answer"
        if not (answered or last_step):
            return 0.0, False, {"success": False, "evaluated": False}
        request = JudgeRequest(
            task_id=self.task.task_id, goal=self.task.task_name, facts=self.task.facts,
            answer=action.text if answered else None, reference_answer=self.task.reference_answer,
            ground_truth=self.task.ground_truth, screenshots=tuple(self._seen))
        settle = functools.partial(_settle, request=request, first_step=self._steps - len(self._seen))
        verdict = self.judges.submit(request)
        if self.hand_off_verdicts:
            self._pending = _then(verdict, settle)
            return 0.0, answered, {"success": False, "evaluated": False}
        reward, info = settle(verdict.result())
        return reward, answered, info


def _settle(verdict, *, request: JudgeRequest, first_step: int) -> tuple[float, dict]:
    return verdict.reward, verdict_info(verdict, request, first_step)


def _then(future: concurrent.futures.Future, fn) -> concurrent.futures.Future:
    """A Future of fn(future's result), or of the exception either raised."""
    out: concurrent.futures.Future = concurrent.futures.Future()

    def done(settled: concurrent.futures.Future) -> None:
        try:
            out.set_result(fn(settled.result()))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever settles `out`
            out.set_exception(exc)

    future.add_done_callback(done)
    return out
