"""The doctor's judge check: a run's judge (its `env.judge` settings) answers one fixed probe request, a rendered
shop page whose rubric the answer meets, within its timeout and retries; the report says how long it took, the
verdict, and on failure the cause and one line naming the fix.

    report = check_judge({"backend": "chat", "url": "http://127.0.0.1:8000/v1", "model": "judge"})
    # {"backend": "chat", "url": ..., "model": "judge", "ok": True, "latency_s": 0.31, "reward": 1.0,
    #  "criteria": [[name, met], ...], "raw": "{...}"}   or   {..., "ok": False, "cause": ..., "fix": ...}

The verdict itself is reported, not required: a judge that answers the schema in time passes, whatever it decides;
one that calls the probe page blocked (every episode it judges so would be dropped) passes with a `warning`.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from jaxwebrl.env.tasks.webgym.judge import BlockedPage, JudgeFailure, JudgeRequest, make_judge
from jaxwebrl.env.tasks.webgym.verdicts import first_marked

PROBE_ANSWER = "4.20"
VLLM_STRUCTURED = "--structured-outputs-config '{\"backend\": \"xgrammar\", \"disable_any_whitespace\": true}'"


def probe_request() -> JudgeRequest:
    """The fixed probe: a 320x120 page that reads "Red Mug  $4.20", and the answer 4.20."""
    from PIL import Image, ImageDraw  # deferred: only the doctor renders the probe page

    page = Image.new("RGB", (320, 120), "white")
    draw = ImageDraw.Draw(page)
    draw.text((16, 16), "Kitchen > Mugs", fill="gray")
    draw.text((16, 56), f"Red Mug    ${PROBE_ANSWER}", fill="black")
    return JudgeRequest(task_id="doctor/judge-probe", goal="Find the red mug's price.",
                        facts=("the page shows the red mug's price",), answer=PROBE_ANSWER,
                        reference_answer=PROBE_ANSWER, ground_truth={"answer": PROBE_ANSWER},
                        screenshots=(np.asarray(page, np.uint8),))


def failure_fix(cause: str, settings: Mapping[str, Any]) -> str:
    """One line naming the fix for a judge failure's `cause` (a JudgeFailure's message)."""
    url, key_env = settings.get("url"), settings.get("api_key_env")
    fixes = (
        ("is not set", f"export the judge's API key in {key_env}"),
        ("TLS certificate not verified", f"the judge cannot verify {url}'s certificate: export SSL_CERT_FILE "
                                         f"naming a CA bundle that holds the CA which signed it"),
        ("unreachable", f"nothing answers at {url}: start the judge server (docs/env.md) or correct env.judge.url"),
        ("timed out", f"no answer within env.judge.timeout_s={settings.get('timeout_s', 60.0)}: raise it, or serve "
                      f"a faster judge"),
        ("HTTP 401", f"the endpoint refused the key: export a valid one in {key_env or 'env.judge.api_key_env'}"),
        ("HTTP 403", f"the endpoint refused the key: export a valid one in {key_env or 'env.judge.api_key_env'}"),
        ("HTTP 404", f"no chat endpoint or model there: env.judge.url ends in /v1 and env.judge.model is a model "
                     f"the server lists at {url}/models"),
        ("HTTP 400", "the endpoint refused the request: the judge model must take images (vLLM: "
                     "--limit-mm-per-prompt at least env.judge.max_screenshots) and response_format json_schema"),
        ("HTTP 429", "rate limited: lower env.judge.rate_per_s or env.judge.concurrency"),
        ("HTTP 5", "the judge server failed the request: see its log"),
        ("malformed verdict", f"the model does not answer the verdict schema: serve it with structured outputs "
                              f"(vLLM: {VLLM_STRUCTURED})"),
        ("malformed response", "the endpoint does not answer OpenAI chat completions: point env.judge.url at one "
                               "(it ends in /v1)"),
        ("declined to judge", "the judge model refuses to judge (its refusal is quoted): use another "
                              "env.judge.model"),
        ("policy server error", "the run's policy server failed the verdict: see the run's log"),
        ("refused (", "the run's policy server refused the judge: the same jaxwebrl version and the run's own "
                      "WORKDIR/transport.token"),
    )
    return first_marked(cause, fixes, "see the cause")   # a malformed verdict's quoted words name no other cause


def check_judge(settings: Mapping[str, Any]) -> dict:
    """The judge check's report (see the module docstring); never raises for a judge that fails."""
    report: dict = {name: settings.get(name) for name in ("backend", "url", "model")}
    t0 = time.perf_counter()
    try:
        verdict = make_judge(settings).judge(probe_request())
    except ValueError as err:   # the settings themselves: their message names the fix
        return dict(report, ok=False, cause=str(err), fix=str(err).rpartition(": ")[2])
    except BlockedPage as err:
        return dict(report, ok=True, latency_s=round(time.perf_counter() - t0, 3), blocked=True, raw=err.raw[:500],
                    warning="the judge calls the probe page blocked: it would drop every episode it judges so; "
                            "check that it reads screenshots, or use another model")
    except JudgeFailure as err:
        return dict(report, ok=False, latency_s=round(time.perf_counter() - t0, 3), cause=str(err),
                    fix=failure_fix(str(err), settings))
    return dict(report, ok=True, latency_s=round(time.perf_counter() - t0, 3), blocked=False,
                reward=verdict.reward, criteria=[list(c) for c in verdict.criteria], raw=verdict.raw[:500])
