"""Judges of a WebGym episode: the rubric, the agent's answer and the episode's screenshots in, a verdict out.

    judge = GroundTruthJudge()                                        # the programmatic answer (bundled sites)
    judge = ChatJudge(base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-VL-8B", api_key_env="JUDGE_API_KEY")
    judge = make_judge(settings)        # a run's env.judge; "engine" (the run's own policy server) is registered by
                                        # jaxwebrl/rollout/engine_judge.py, which its rollout workers import
    verdict = judge.judge(request)       # Verdict: criteria [(name, met)], reward 1.0 iff all met, raw answer
    pool = JudgePool(judge, concurrency=8, rate_per_s=4.0)
    futures = [pool.submit(r) for r in requests]   # asynchronous and batched: a browser never waits on a verdict

The chat judge follows WebGym's rubric: the request flags a blocked page (CAPTCHA, access denied); Criterion B asks
whether the screenshots support the answer; Criterion A checks each fact in turn, stopping at the first one not
met; a reference answer, if any, is matched last. The verdict comes back as one JSON object under a JSON schema
(`response_format`, grammar-constrained where the server supports it) and is validated field by field.

A timeout (`timeout_s` bounds each attempt's whole time: connect, TLS handshake, headers, body; `deadline_http.py`),
a connection error, an HTTP error, a malformed verdict (all retried with exponential backoff, except HTTP errors other
than 429 and 5xx), an HTTPS certificate it cannot verify (not retried; the CA bundle is SSL_CERT_FILE's, as for any
OpenSSL client) or a blocked page is a `JudgeFailure` (an `EnvFailure`) naming its cause: the episode is dropped and
counted, never scored 0. The API key is read from the environment variable `api_key_env` names when a request is
sent; it is never stored on the judge, written to disk or put in a message.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import http.client
import io
import json
import os
import ssl
import threading
import time
import urllib.error
from typing import Any, Callable, Mapping

import numpy as np

from jaxwebrl.env.agent.prompt import inert
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.tasks.webgym.deadline_http import DeadlinePassed, post_within
from jaxwebrl.env.tasks.webtask.task_spec import text_matches

MAX_SCREENSHOTS = 48          # WebGym submits at most 48 screenshots to the judge
RETRIED_STATUS = (429, 500, 502, 503, 504)
VERDICT_KEYS = ("blocked", "answer_supported", "facts", "reference_matched")   # a verdict's keys, all and only


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


def verdict_schema(facts: int, reference: bool, check_blocked: bool = True) -> dict:
    """The JSON schema of the chat judge's answer for a rubric of `facts` facts; reference_matched is a boolean with
    a `reference` answer, null without one; `check_blocked` False: blocked is always false (sites that cannot block
    a page, where the judge's flag could only be a false alarm)."""
    blocked = {"type": "boolean"} if check_blocked else {"type": "boolean", "enum": [False]}
    return {"type": "object", "additionalProperties": False,
            "required": list(VERDICT_KEYS),
            "properties": {"blocked": blocked, "answer_supported": {"type": "boolean"},
                           "facts": {"type": "array", "items": {"type": "boolean"}, "minItems": facts,
                                     "maxItems": facts},
                           "reference_matched": {"type": "boolean" if reference else "null"}}}


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
    check_blocked: bool = True
    backend = "chat"

    def judge(self, request: JudgeRequest) -> Verdict:
        t0 = time.perf_counter()
        shown = screenshots_shown(request, self.max_screenshots)
        raw, criteria = self._ask(self._body(request, shown), request)
        return Verdict(criteria, raw, self.backend, time.perf_counter() - t0, shown)

    def _body(self, request: JudgeRequest, shown: tuple[int, ...]) -> dict:
        content = [{"type": "text", "text": rubric_text(request, len(shown))}] + [
            {"type": "image_url", "image_url": {"url": _png_data_url(request.screenshots[i])}} for i in shown]
        return {"model": self.model, "temperature": 0.0,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "verdict", "strict": True,
                    "schema": verdict_schema(len(request.facts), bool(request.reference_answer),
                                             self.check_blocked)}}}

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

        def attempt():
            try:   # connect, headers and body within timeout_s, however slowly they trickle in
                message = json.loads(post_within(url, data, headers, self.timeout_s))["choices"][0]["message"]
                if message["content"] is None and message.get("refusal"):   # OpenAI's refusal: no content to parse
                    raise AttemptFailed(f"declined to judge (refusal {json.dumps(str(message['refusal'])[:200])})")
                return message["content"], rubric_criteria(message["content"], request, self.model,
                                                           self.check_blocked)
            except DeadlinePassed as err:
                raise AttemptFailed(str(err)) from err
            except urllib.error.HTTPError as err:   # a redirect too: never followed (deadline_http.py)
                moved = (f" (redirected to {err.headers.get('Location')}: set env.judge.url to the endpoint itself)"
                         if 300 <= err.code < 400 else "")
                raise AttemptFailed(f"HTTP {err.code}{moved}", retry=err.code in RETRIED_STATUS) from err
            except (TimeoutError, OSError) as err:   # URLError is an OSError; a read timeout a TimeoutError
                reason = getattr(err, "reason", err)
                if isinstance(reason, ssl.SSLCertVerificationError):   # every attempt would fail alike
                    raise AttemptFailed(f"TLS certificate not verified ({reason.verify_message}): export "
                                        f"SSL_CERT_FILE=<a CA bundle holding the certificate that signed the "
                                        f"judge's>", retry=False) from err
                raise AttemptFailed("timed out" if "timed out" in str(reason) else f"unreachable ({reason})") from err
            except http.client.HTTPException as err:   # another protocol on that port, or an answer cut short
                raise AttemptFailed(f"malformed response ({type(err).__name__}: not an HTTP answer, or one cut "
                                    f"short)") from err
            except MalformedVerdict as err:
                raise AttemptFailed(str(err)) from err
            except (ValueError, KeyError, IndexError, TypeError) as err:
                raise AttemptFailed("malformed response (not an OpenAI chat completion)") from err

        return retrying(attempt, self.retries, self.backoff_s, f"judge {self.model} on {request.task_id}", url)


class AttemptFailed(Exception):
    """One attempt of a judge's request failed for `cause`; `retry` False: the others would fail alike."""

    def __init__(self, cause: str, *, retry: bool = True):
        super().__init__(cause)
        self.retry = retry


def retrying(attempt, retries: int, backoff_s: float, judge: str, where: str):
    """`attempt()`'s value, tried up to 1 + `retries` times with exponential backoff (`backoff_s`, doubling) while it
    raises a retryable AttemptFailed; else a JudgeFailure '{judge}: {cause} after N attempt(s) at {where}'."""
    for n in range(retries + 1):
        if n:
            time.sleep(backoff_s * 2 ** (n - 1))
        try:
            return attempt()
        except AttemptFailed as failed:
            cause = str(failed)
            if not failed.retry:
                break
    raise JudgeFailure(f"{judge}: {cause} after {n + 1} attempt(s) at {where}")


def screenshots_shown(request: JudgeRequest, limit: int) -> tuple[int, ...]:
    """The indices of the screenshots a judge is shown: the last `limit` (where the answer was found)."""
    count = len(request.screenshots)
    return tuple(range(max(0, count - int(limit)), count))


def rubric_text(request: JudgeRequest, shots: int) -> str:
    """The user turn's text of a rubric judge (`SYSTEM` its instructions), before its `shots` screenshots; special-token
    forms in it (an agent's answer that spells `<|image_pad|>`) are text (`inert`), as in the agent's prompt."""
    facts = "\n".join(f"{i + 1}. {fact}" for i, fact in enumerate(request.facts))
    return inert(f"Task: {request.goal}\nRubric facts:\n{facts}\nAgent's answer: {request.answer!r}\n"
                 f"Reference answer: {request.reference_answer!r}\n{shots} screenshots follow.")


def verdict_regex(facts: int, reference: bool, check_blocked: bool = True) -> str:
    """The verdict of `verdict_schema(facts, reference, check_blocked)` as a regex over its compact JSON (no
    whitespace): the grammar a judge decoded under by token constraints answers, so its verdict always parses;
    reference_matched is null without a reference answer."""
    flag = "(true|false)"
    listed = "" if facts < 1 else flag + ("" if facts == 1 else f"(,{flag}){{{facts - 1}}}")
    return (r'\{"blocked":' + (flag if check_blocked else "false") + r',"answer_supported":' + flag
            + r',"facts":\[' + listed + r'\],"reference_matched":' + (flag if reference else "null") + r"\}")


def rubric_criteria(raw: str, request: JudgeRequest, judge_name: str,
                    check_blocked: bool = True) -> tuple[tuple[str, bool], ...]:
    """WebGym's criteria from a judge's JSON verdict (see the module docstring); MalformedVerdict when it is not
    the verdict schema (`verdict_schema`: a null reference_matched where there is a reference answer, a blocked
    page where none is asked, included), BlockedPage when it flags a blocked page."""
    try:
        verdict = json.loads(raw)
        blocked, supported, facts = verdict["blocked"], verdict["answer_supported"], verdict["facts"]
        matched = verdict["reference_matched"]
        matched_ok = isinstance(matched, bool) or (matched is None and not request.reference_answer)
        ok = (set(verdict) == set(VERDICT_KEYS)
              and isinstance(blocked, bool) and (check_blocked or not blocked) and isinstance(supported, bool)
              and isinstance(facts, list) and len(facts) == len(request.facts)
              and all(isinstance(f, bool) for f in facts) and matched_ok)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        rules = [] if check_blocked else ["blocked false"]
        rules += ["reference_matched true or false"] if request.reference_answer else []
        raise MalformedVerdict(f"malformed verdict {str(raw)[:200]!r}: expected the verdict schema "
                               + (f"({'; '.join(rules)}) " if rules else "") + f"with {len(request.facts)} facts")
    if blocked:
        raise BlockedPage(f"judge {judge_name} on {request.task_id}: blocked page (CAPTCHA or access denied)", raw)
    criteria = [("B: the screenshots support the answer", supported)]
    for fact, met in zip(request.facts, facts):
        criteria.append((f"A: {fact}", met))
        if not met:
            break   # WebGym stops at the first fact not met
    if request.reference_answer and all(met for _, met in criteria):
        criteria.append(("the answer matches the reference answer", bool(matched)))
    return tuple(criteria)


def _flag(text: str) -> bool:
    """A command-line boolean: true/false, 1/0, yes/no."""
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"not a boolean: {text!r} (true or false)")
    return text.lower() in ("true", "1", "yes")


JUDGE_BACKENDS = ("ground_truth", "chat", "engine")
# Backends built outside this package, by name -> factory(settings) -> judge: "engine" (the run's own policy
# server, which only rollout/ reaches) registers itself from jaxwebrl/rollout/engine_judge.py.
_REGISTERED: dict[str, Callable[[dict], Any]] = {}
ENGINE_PROBE = "python3 -m jaxwebrl.rollout.engine_judge --run=WORKDIR"   # the doctor's check of an engine judge


def register_judge_backend(name: str, factory: Callable[[dict], Any]) -> None:
    """Make `make_judge` build backend `name` with `factory(settings)` (a judge: `.judge(request) -> Verdict`)."""
    _REGISTERED[name] = factory
JUDGE_SETTINGS = {"backend": str, "url": str, "model": str, "api_key_env": str, "timeout_s": float, "retries": int,
                  "backoff_s": float, "max_screenshots": int, "check_blocked": _flag, "concurrency": int,
                  "rate_per_s": float}   # a run's env.judge (configs/base.py)


def add_judge_flags(parser, help: str, backend_required: bool = False) -> None:
    """`--judge.<name>` on an argparse `parser` for each of a run's env.judge settings (`judge_flags` reads them),
    each refused as its config field (configs/base.py) refuses it: one usage line naming the fix."""
    from configs.base import FIELDS  # deferred: the fields' checks, for the commands that take judge flags

    def checked(name: str, kind):
        def parse(text: str):
            value = kind(text)
            problem = FIELDS[f"env.judge.{name}"].problem(value)
            if problem:
                raise argparse.ArgumentTypeError(f"{text}: {problem}")
            return value
        parse.__name__ = kind.__name__   # argparse names the type in "invalid <type> value"
        return parse

    for name, kind in JUDGE_SETTINGS.items():
        parser.add_argument(f"--judge.{name}", type=checked(name, kind),
                            required=backend_required and name == "backend", help=f"{help}: env.judge.{name}")


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
    if backend in _REGISTERED:
        return _REGISTERED[backend](settings)
    if backend == "engine":
        raise ValueError("env.judge.backend='engine' judges on a training run's own policy server, which only its "
                         f"rollout workers reach; check a running run's with: {ENGINE_PROBE}")
    if backend != "chat":
        raise ValueError(f"env.judge.backend={backend!r}: use one of {list(JUDGE_BACKENDS)}")
    if not (settings.get("url") and settings.get("model")):
        raise ValueError("env.judge.backend='chat' needs env.judge.url and env.judge.model: name the endpoint "
                         "(e.g. http://127.0.0.1:8000/v1) and its model")
    return ChatJudge(base_url=settings["url"], model=settings["model"], api_key_env=settings.get("api_key_env"),
                     timeout_s=float(settings.get("timeout_s", 60.0)), retries=int(settings.get("retries", 2)),
                     backoff_s=float(settings.get("backoff_s", 1.0)),
                     max_screenshots=int(settings.get("max_screenshots", MAX_SCREENSHOTS)),
                     check_blocked=bool(settings.get("check_blocked", True)))


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
