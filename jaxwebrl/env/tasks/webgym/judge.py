"""Judges of a WebGym episode: the rubric, the agent's answer and the episode's screenshots in, a verdict out.

    judge = GroundTruthJudge()                                        # the programmatic answer (bundled sites)
    judge = ChatJudge(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-VL-8B", api_key_env="JUDGE_API_KEY")
    verdict = judge.judge(request)       # Verdict: criteria [(name, met)], reward 1.0 iff all met, raw answer
    pool = JudgePool(judge, concurrency=8, rate_per_s=4.0)
    futures = [pool.submit(r) for r in requests]   # asynchronous and batched: a browser never waits on a verdict

The chat judge follows WebGym's rubric: the request flags a blocked page (CAPTCHA, access denied); Criterion B asks
whether the screenshots support the answer; Criterion A checks each fact in turn, stopping at the first one not
met; a reference answer, if any, is matched last. The verdict comes back as one JSON object under a JSON schema
(`response_format`, grammar-constrained where the server supports it) and is validated field by field.

A timeout (`timeout_s` bounds each attempt's whole time), a connection error, an HTTP error, a malformed verdict
(all retried with exponential backoff, except HTTP errors other than 429 and 5xx) or a blocked page is a
`JudgeFailure` (an `EnvFailure`) naming its cause: the episode is dropped and counted, never scored 0. The API key is
read from the environment variable `api_key_env` names when a request is sent; it is never stored on the judge,
written to disk or put in a message.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import io
import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Mapping

import numpy as np

from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.tasks.webtask.task_spec import text_matches

MAX_SCREENSHOTS = 48          # WebGym submits at most 48 screenshots to the judge
RETRIED_STATUS = (429, 500, 502, 503, 504)


class JudgeFailure(EnvFailure):
    """The judge gave no usable verdict (timeout, HTTP error, malformed verdict, blocked page): an env failure."""


class BlockedPage(JudgeFailure):
    """The judge found a CAPTCHA or access-denied page instead of the site; `raw` its answer (a valid verdict)."""

    def __init__(self, message: str, raw: str):
        super().__init__(message)
        self.raw = raw


class MalformedVerdict(JudgeFailure):
    """The judge's answer is not a verdict of the schema (retried: `ChatJudge` names it with its attempts)."""


@dataclasses.dataclass(frozen=True)
class JudgeRequest:
    """What a judge sees of one episode. screenshots: uint8 [H, W, 3] each, oldest first."""

    task_id: str
    goal: str
    facts: tuple[str, ...]
    answer: str | None
    reference_answer: str | None = None
    ground_truth: dict | None = None
    screenshots: tuple = ()


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The judge's verdict: each criterion in the order checked and whether it is met; `raw` its own answer;
    `screenshots` the indices into the request's screenshots the judge looked at."""

    criteria: tuple[tuple[str, bool], ...]
    raw: str
    backend: str
    seconds: float
    screenshots: tuple[int, ...] = ()

    @property
    def reward(self) -> float:
        return float(bool(self.criteria) and all(met for _, met in self.criteria))


class GroundTruthJudge:
    """The programmatic answer: the task's `ground_truth` ({"answer", "mode"}), else its reference answer."""

    backend = "ground_truth"

    def judge(self, request: JudgeRequest) -> Verdict:
        t0 = time.perf_counter()
        truth = request.ground_truth or ({"answer": request.reference_answer} if request.reference_answer else None)
        if truth is None:
            raise JudgeFailure(f"{request.task_id}: the ground_truth judge needs a ground_truth or reference_answer")
        met = request.answer is not None and text_matches(request.answer, truth["answer"], truth.get("mode", "exact"),
                                                          case_sensitive=False)
        return Verdict((("answer matches the ground truth", met),), json.dumps({"answer": request.answer}),
                       self.backend, time.perf_counter() - t0)


def _png_data_url(image: np.ndarray) -> str:
    from PIL import Image  # deferred: only a judge that sends screenshots encodes them

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, np.uint8)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def verdict_schema(facts: int) -> dict:
    """The JSON schema of the chat judge's answer for a rubric of `facts` facts."""
    return {"type": "object", "additionalProperties": False,
            "required": ["blocked", "answer_supported", "facts", "reference_matched"],
            "properties": {"blocked": {"type": "boolean"}, "answer_supported": {"type": "boolean"},
                           "facts": {"type": "array", "items": {"type": "boolean"}, "minItems": facts,
                                     "maxItems": facts},
                           "reference_matched": {"type": ["boolean", "null"]}}}


SYSTEM = ("You judge whether a web agent completed a task, from its screenshots (oldest first) and its final answer. "
          "Answer with one JSON object: blocked (the pages show a CAPTCHA, an access-denied or error page instead of "
          "the site), answer_supported (the screenshots support the answer), facts (one boolean per rubric fact, in "
          "order: is it met?), reference_matched (does the answer agree with the reference answer; null without one).")


@dataclasses.dataclass
class ChatJudge:
    """Any OpenAI-compatible chat endpoint that takes images (a local vLLM server, a hosted API)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 1.0
    max_screenshots: int = MAX_SCREENSHOTS
    backend = "chat"

    def judge(self, request: JudgeRequest) -> Verdict:
        t0 = time.perf_counter()
        raw, criteria = self._ask(self._body(request), request)
        shown = min(len(request.screenshots), self.max_screenshots)
        return Verdict(criteria, raw, self.backend, time.perf_counter() - t0,
                       tuple(range(len(request.screenshots) - shown, len(request.screenshots))))

    def _body(self, request: JudgeRequest) -> dict:
        shots = list(request.screenshots)[-self.max_screenshots:]   # the last ones: where the answer was found
        facts = "\n".join(f"{i + 1}. {fact}" for i, fact in enumerate(request.facts))
        text = (f"Task: {request.goal}\nRubric facts:\n{facts}\nAgent's answer: {request.answer!r}\n"
                f"Reference answer: {request.reference_answer!r}\n{len(shots)} screenshots follow.")
        content = [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": _png_data_url(s)}}
                                                      for s in shots]
        return {"model": self.model, "temperature": 0.0,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "verdict", "strict": True, "schema": verdict_schema(len(request.facts))}}}

    def _ask(self, body: dict, request: JudgeRequest) -> tuple[str, tuple[tuple[str, bool], ...]]:
        """The endpoint's answer and its criteria; retries 429/5xx, timeouts, refused connections and malformed
        answers (a truncated or off-schema verdict may come out right the next time), not a blocked page."""
        headers = {"Content-Type": "application/json"}
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise JudgeFailure(f"judge {self.model}: the environment variable {self.api_key_env} holding its API "
                                   f"key is not set: export it")
            headers["Authorization"] = "Bearer " + key
        data = json.dumps(body).encode()
        url = self.base_url.rstrip("/") + "/chat/completions"
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            start = time.monotonic()
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=self.timeout_s) as r:
                    raw = json.loads(r.read())["choices"][0]["message"]["content"]
                took = time.monotonic() - start
                if took > self.timeout_s:   # the socket's timeout bounds each read and write, not their sum
                    cause = f"timed out ({took:.3f} s > timeout_s)"
                    continue
                return raw, self._criteria(raw, request)
            except urllib.error.HTTPError as err:
                cause = f"HTTP {err.code}"
                if err.code not in RETRIED_STATUS:
                    break
            except (TimeoutError, OSError) as err:   # URLError is an OSError; a read timeout a TimeoutError
                reason = getattr(err, "reason", err)
                cause = "timed out" if "timed out" in str(reason) else f"unreachable ({reason})"
            except MalformedVerdict as err:
                cause = str(err)
            except (ValueError, KeyError, IndexError, TypeError):
                cause = "malformed response (not an OpenAI chat completion)"
        raise JudgeFailure(f"judge {self.model} on {request.task_id}: {cause} after {attempt + 1} attempt(s) at {url}")

    def _criteria(self, raw: str, request: JudgeRequest) -> tuple[tuple[str, bool], ...]:
        """WebGym's criteria from the judge's JSON (see the module docstring); JudgeFailure when it is malformed."""
        try:
            verdict = json.loads(raw)
            blocked, supported, facts = verdict["blocked"], verdict["answer_supported"], verdict["facts"]
            matched = verdict.get("reference_matched")
            ok = (isinstance(blocked, bool) and isinstance(supported, bool) and isinstance(facts, list)
                  and len(facts) == len(request.facts) and all(isinstance(f, bool) for f in facts)
                  and (matched is None or isinstance(matched, bool)))
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            raise MalformedVerdict(f"malformed verdict {str(raw)[:200]!r}: expected the verdict schema with "
                                   f"{len(request.facts)} facts")
        if blocked:
            raise BlockedPage(f"judge {self.model} on {request.task_id}: blocked page (CAPTCHA or access denied)", raw)
        criteria = [("B: the screenshots support the answer", supported)]
        for fact, met in zip(request.facts, facts):
            criteria.append((f"A: {fact}", met))
            if not met:
                break   # WebGym stops at the first fact not met
        if request.reference_answer and all(met for _, met in criteria):
            criteria.append(("the answer matches the reference answer", bool(matched)))
        return tuple(criteria)


JUDGE_BACKENDS = ("ground_truth", "chat")
JUDGE_SETTINGS = {"backend": str, "url": str, "model": str, "api_key_env": str, "timeout_s": float, "retries": int,
                  "backoff_s": float, "max_screenshots": int, "concurrency": int,
                  "rate_per_s": float}   # a run's env.judge (configs/base.py)


def add_judge_flags(parser, help: str, backend_required: bool = False) -> None:
    """`--judge.<name>` on an argparse `parser` for each of a run's env.judge settings (`judge_flags` reads them)."""
    for name, kind in JUDGE_SETTINGS.items():
        parser.add_argument(f"--judge.{name}", type=kind, required=backend_required and name == "backend",
                            help=f"{help}: env.judge.{name}")


def judge_flags(args) -> dict:
    """The env.judge settings given as `--judge.<name>` flags in parsed `args` (a Namespace)."""
    given = {name: getattr(args, f"judge.{name}") for name in JUDGE_SETTINGS}
    return {name: value for name, value in given.items() if value is not None}


def make_judge(settings: Mapping[str, Any] | None):
    """The judge a run's `env.judge` settings name (None or backend "ground_truth": the programmatic answer);
    ValueError naming the fix for an unknown backend or a chat judge without its endpoint."""
    settings = dict(settings or {})
    backend = settings.get("backend") or "ground_truth"
    if backend == "ground_truth":
        return GroundTruthJudge()
    if backend != "chat":
        raise ValueError(f"env.judge.backend={backend!r}: use one of {list(JUDGE_BACKENDS)}")
    if not (settings.get("url") and settings.get("model")):
        raise ValueError("env.judge.backend='chat' needs env.judge.url and env.judge.model: name the endpoint "
                         "(e.g. http://127.0.0.1:8000/v1) and its model")
    return ChatJudge(base_url=settings["url"], model=settings["model"], api_key_env=settings.get("api_key_env"),
                     timeout_s=float(settings.get("timeout_s", 60.0)), retries=int(settings.get("retries", 2)),
                     backoff_s=float(settings.get("backoff_s", 1.0)),
                     max_screenshots=int(settings.get("max_screenshots", MAX_SCREENSHOTS)))


class JudgePool:
    """Judging off the browsers' threads: `submit` returns a Future of a Verdict (or of a JudgeFailure raised);
    at most `concurrency` requests in flight, started at most `rate_per_s` a second (None: no limit)."""

    def __init__(self, judge, concurrency: int = 8, rate_per_s: float | None = None):
        self.judge = judge
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency,
                                                               thread_name_prefix="judge")
        self._interval = 0.0 if not rate_per_s else 1.0 / rate_per_s
        self._next_start = time.monotonic()
        self._lock = threading.Lock()

    def submit(self, request: JudgeRequest) -> concurrent.futures.Future:
        return self._executor.submit(self._paced, request)

    def judge_batch(self, requests) -> list:
        """Every request's Verdict, or its JudgeFailure, in order."""
        futures = [self.submit(r) for r in requests]
        return [f.exception() or f.result() for f in futures]

    def _paced(self, request: JudgeRequest) -> Verdict:
        with self._lock:
            start = max(self._next_start, time.monotonic())
            self._next_start = start + self._interval
        time.sleep(max(0.0, start - time.monotonic()))
        return self.judge.judge(request)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
