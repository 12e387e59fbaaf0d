"""A WebGym task in Chromium scored by a judge: the JSON web-task env, plus the screenshots the agent saw and, when
the episode ends (an answer, or the last step), a `judge.py` verdict on the rubric as its reward.

    env = make_env("webgym:tasks.jsonl:3", judge={"backend": "chat", "url": "http://127.0.0.1:8000/v1",
                                                  "model": "Qwen/Qwen3-VL-8B", "api_key_env": "JUDGE_API_KEY"})

StepResult.info of the last step holds `verdict` ([criterion, met] pairs), `judge_raw` (the judge's own answer),
`judge_backend` and `judge_s`. A `JudgeFailure` propagates from `step`: it is an `EnvFailure`, so the rollout worker
drops the episode and counts it, never scoring it 0.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.tasks.webgym.judge import MAX_SCREENSHOTS, ChatJudge, GroundTruthJudge, JudgePool, JudgeRequest
from jaxwebrl.env.tasks.webgym.webgym_tasks import WebGymTask
from jaxwebrl.env.tasks.webtask.task_spec import WebTaskSpec
from jaxwebrl.env.tasks.webtask.webtask import WebTaskEnv

JUDGE_BACKENDS = ("ground_truth", "chat")


def judge_pool(settings: Mapping[str, Any] | None) -> JudgePool:
    """The process's one pool of the judge a run's `env.judge` names (None or backend "ground_truth": the
    programmatic answer): every env of a worker process judges through it, so its concurrency and rate limit hold
    for the process."""
    return _pool(json.dumps(dict(settings or {}), sort_keys=True))


@functools.lru_cache(maxsize=None)
def _pool(settings_json: str) -> JudgePool:
    settings = json.loads(settings_json)
    backend = settings.get("backend", "ground_truth")
    if backend == "ground_truth":
        return JudgePool(GroundTruthJudge())
    if backend != "chat":
        raise ValueError(f"env.judge.backend={backend!r}: use one of {list(JUDGE_BACKENDS)}")
    judge = ChatJudge(base_url=settings["url"], model=settings["model"], api_key_env=settings.get("api_key_env"),
                      timeout_s=float(settings.get("timeout_s", 60.0)), retries=int(settings.get("retries", 2)),
                      backoff_s=float(settings.get("backoff_s", 1.0)))
    return JudgePool(judge, concurrency=int(settings.get("concurrency", 8)), rate_per_s=settings.get("rate_per_s"))


class WebGymEnv(WebTaskEnv):
    """One WebGym task (`task`, played as `spec`) whose reward is the verdict of `judges` (a JudgePool; see the
    module docstring)."""

    def __init__(self, spec: WebTaskSpec, task: WebGymTask, judges: JudgePool, **options):
        super().__init__(spec, **options)
        self.task, self.judges = task, judges
        self._seen: list = []

    def reset(self, seed: int):
        self._seen = []
        return super().reset(seed)

    def _observe(self):
        observation = super()._observe()
        self._seen = (self._seen + [observation.screenshot])[-MAX_SCREENSHOTS:]
        return observation

    def _judge(self, action: Action, last_step: bool) -> tuple[float, bool, dict]:
        answered = action.kind == "answer"
        if not (answered or last_step):
            return 0.0, False, {"success": False, "evaluated": False}
        verdict = self.judges.submit(JudgeRequest(
            task_id=self.task.task_id, goal=self.task.task_name, facts=self.task.facts,
            answer=action.text if answered else None, reference_answer=self.task.reference_answer,
            ground_truth=self.task.ground_truth, screenshots=tuple(self._seen))).result()
        return verdict.reward, answered, {
            "success": verdict.reward > 0, "evaluated": True, "verdict": [list(c) for c in verdict.criteria],
            "judge_raw": verdict.raw, "judge_backend": verdict.backend, "judge_s": round(verdict.seconds, 3)}
