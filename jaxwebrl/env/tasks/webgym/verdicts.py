"""A verdict as the episode record keeps it, and back: what a WebGym episode's last step reports of its judging,
the request a saved episode can be judged again from, and the cause of a judge failure in one word.

    info = verdict_info(verdict, request, first_step=3)   # {"success", "evaluated", "verdict", "judge_raw", ...}
    request = request_of(episode.info["judge"], screenshots)   # the saved request, its screenshots fetched back
    failure_cause("JudgeFailure: judge m on t: HTTP 503 after 3 attempt(s) at ...") == "http_503"

`verdict_info` keys: `verdict` ([criterion, met] pairs, in the order checked), `judge_raw` (the judge's own answer,
cut to JUDGE_RAW_CHARS), `judge_backend`, `judge_s` (seconds the verdict took), `judged_steps` (the episode's steps
whose screenshots the judge looked at; the rollout worker adds their refs as `judged_refs`) and `judge_request`
(the request without its screenshots: task_id, goal, facts, answer, reference_answer, ground_truth).
"""

from __future__ import annotations

import dataclasses
import re

from jaxwebrl.env.tasks.webgym.judge import JudgeRequest, Verdict

JUDGE_RAW_CHARS = 2000   # the judge's raw answer kept with the episode is cut to this
# (what the message says, the cause's name); an HTTP error is "http_<status>"
_CAUSES = (("timed out", "timeout"), ("malformed", "malformed"), ("blocked page", "blocked"),
           ("unreachable", "unreachable"), ("API key is not set", "no_api_key"),
           ("needs a ground_truth", "no_ground_truth"), ("policy server error", "engine_error"),
           ("refused (", "refused"), ("TLS certificate not verified", "tls"), ("declined to judge", "refusal"))


def verdict_info(verdict: Verdict, request: JudgeRequest, first_step: int) -> dict:
    """The last step's info of a judged episode (module docstring); `first_step`: the episode step whose
    screenshot is the request's first."""
    return {"success": verdict.reward > 0, "evaluated": True, "verdict": [list(c) for c in verdict.criteria],
            "judge_raw": verdict.raw[:JUDGE_RAW_CHARS], "judge_backend": verdict.backend,
            "judge_s": round(verdict.seconds, 3), "judged_steps": [first_step + i for i in verdict.screenshots],
            "judge_request": {f.name: getattr(request, f.name) for f in dataclasses.fields(request)
                              if f.name != "screenshots"}}


def request_of(record: dict, screenshots: tuple = ()) -> JudgeRequest:
    """The JudgeRequest a saved verdict record (`verdict_info`'s keys) was judged from; `screenshots`: uint8
    [H, W, 3] each, the images of its `judged_refs` fetched back."""
    saved = dict(record["judge_request"])
    return JudgeRequest(**dict(saved, facts=tuple(saved["facts"]), screenshots=tuple(screenshots)))


def failure_cause(message: str) -> str:
    """The cause of a judge failure from its message: timeout, http_<status>, malformed, blocked, unreachable,
    no_api_key, no_ground_truth, engine_error, refused (the engine judge's policy server), tls (an HTTPS certificate not
    verified), refusal (the chat judge's model declined to judge), or other. The marker that comes first decides (a
    malformed verdict's message quotes the verdict, whose words may be any marker)."""
    http = re.search(r"\bHTTP (\d{3})\b", message)
    return first_marked(message, _CAUSES + (((http.group(0), f"http_{http.group(1)}"),) if http else ()), "other")


def first_marked(message: str, markers, default):
    """The value of the (marker, value) pair whose marker comes first in `message`; `default` when none is in it."""
    found = [(message.find(marker), n) for n, (marker, _) in enumerate(markers) if marker in message]
    return markers[min(found)[1]][1] if found else default
