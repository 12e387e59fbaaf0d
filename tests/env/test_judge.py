"""The WebGym judges: the ground truth; an OpenAI-compatible chat endpoint (a real HTTP server on loopback that
answers as the test scripts it) through success, a fact not met, a timeout, 5xx (retried), a malformed verdict, a
blocked page and a dead server, each failure a JudgeFailure naming its cause; the key from the environment, never
in a message; the pool judges concurrently; a WebGym episode in Chromium rewarded by the run's judge."""

import http.server
import json
import socket
import threading
import time

import numpy as np
import pytest

from configs import base
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.registry import env_specs, make_env
from jaxwebrl.env.tasks.webgym.judge import (ChatJudge, GroundTruthJudge, JudgeFailure, JudgePool, JudgeRequest,
                                             MalformedVerdict, make_judge, rubric_criteria, verdict_schema)
from jaxwebrl.env.tasks.webgym.judge_probe import check_judge, failure_fix
from jaxwebrl.env.tasks.webgym.verdicts import failure_cause
from jaxwebrl.rollout.spec import worker_spec
from jaxwebrl.train.config_validation import ConfigError, validate

KEY = "sk-test-secret-0123456789"
FACTS = ("opened the Kitchen category", "opened the Red Mug page", "answered its price")


def request(answer="4.20", **kw):
    shots = tuple(np.full((24, 32, 3), i, np.uint8) for i in range(kw.pop("shots", 3)))
    return JudgeRequest(task_id="shop-1", goal="Find the red mug's price.", facts=FACTS, answer=answer,
                        reference_answer=kw.pop("reference_answer", "4.20"), screenshots=shots, **kw)


class Endpoint:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 that answers from a script of (status, content,
    delay) entries, one per request (the last repeats; a dict content is the whole message); records every request
    body and its headers."""

    def __init__(self, script):
        self.script, self.bodies, self.headers, self.in_flight, self.max_in_flight = list(script), [], [], 0, 0
        lock, endpoint = threading.Lock(), self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    endpoint.bodies.append(body)
                    endpoint.headers.append(dict(self.headers))
                    status, content, delay = endpoint.script[min(len(endpoint.bodies), len(endpoint.script)) - 1]
                    endpoint.in_flight += 1
                    endpoint.max_in_flight = max(endpoint.max_in_flight, endpoint.in_flight)
                time.sleep(delay)
                with lock:
                    endpoint.in_flight -= 1
                message = content if isinstance(content, dict) else {"role": "assistant", "content": content}
                payload = json.dumps({"choices": [{"message": message}]}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass   # the client gave up (a timeout)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def verdict(facts=(True, True, True), supported=True, blocked=False, matched=True):
    return json.dumps({"blocked": blocked, "answer_supported": supported, "facts": list(facts),
                       "reference_matched": matched})


@pytest.fixture
def endpoint(request):
    server = Endpoint(request.param)
    yield server
    server.close()


def judge_of(endpoint, **kw):
    return ChatJudge(base_url=endpoint.url, model="judge-model", api_key_env="TEST_JUDGE_KEY", backoff_s=0.01, **kw)


def test_the_ground_truth_judges_the_answer():
    judge = GroundTruthJudge()
    assert judge.judge(request(" 4.20 ")).reward == 1.0 and judge.judge(request("5.00")).reward == 0.0
    assert judge.judge(request(None)).reward == 0.0
    assert judge.judge(request("about 4.20", ground_truth={"answer": "4.20", "mode": "contains"})).reward == 1.0
    with pytest.raises(JudgeFailure, match="needs a ground_truth or reference_answer"):
        judge.judge(request(reference_answer=None))


def test_a_regex_ground_truth_keeps_its_upper_case_escapes_under_ignorecase():
    """A case-insensitive regex is matched with IGNORECASE, its pattern as written: lower-cased, \\S would become \\s
    (a right answer scored 0) and \\Z the bad escape \\z (a crash, no verdict)."""
    judge = GroundTruthJudge()
    word = {"answer": r"^\S+$", "mode": "regex"}
    assert judge.judge(request("4.20", ground_truth=word)).reward == 1.0
    assert judge.judge(request("4 20", ground_truth=word)).reward == 0.0
    assert judge.judge(request("4.20", ground_truth={"answer": r"4\.20\Z", "mode": "regex"})).reward == 1.0
    assert judge.judge(request("RED MUG", ground_truth={"answer": r"^red\s\D+$", "mode": "regex"})).reward == 1.0


@pytest.mark.parametrize("endpoint", [[(200, verdict(), 0.0)]], indirect=True)
def test_a_met_rubric_is_reward_one_and_the_request_is_what_webgym_sends(endpoint, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    result = judge_of(endpoint, max_screenshots=2).judge(request(shots=3))
    assert result.reward == 1.0 and result.raw == verdict() and result.backend == "chat"
    assert [name for name, _ in result.criteria] == ["B: the screenshots support the answer"] + \
        [f"A: {f}" for f in FACTS] + ["the answer matches the reference answer"]
    (body,), (headers,) = endpoint.bodies, endpoint.headers
    assert headers["Authorization"] == f"Bearer {KEY}" and body["model"] == "judge-model"
    images = [c for c in body["messages"][1]["content"] if c["type"] == "image_url"]
    assert len(images) == 2 and all(c["image_url"]["url"].startswith("data:image/png;base64,") for c in images)
    assert body["response_format"]["json_schema"]["schema"] == verdict_schema(3, reference=True)


@pytest.mark.parametrize("endpoint", [[(200, verdict(facts=(True, False, True)), 0.0)]], indirect=True)
def test_criterion_a_stops_at_the_first_fact_not_met(endpoint, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    result = judge_of(endpoint).judge(request())
    assert result.reward == 0.0 and [met for _, met in result.criteria] == [True, True, False]


@pytest.mark.parametrize("endpoint, cause, attempts, metric", [
    ([(503, "", 0.0), (502, "", 0.0), (200, verdict(), 0.0)], None, 3, None),             # retried, then judged
    ([(500, "", 0.0)], r"HTTP 500 after 3 attempt\(s\)", 3, "http_500"),
    ([(401, "", 0.0)], r"HTTP 401 after 1 attempt\(s\)", 1, "http_401"),                   # not retried
    ([(200, "I think the agent did well", 0.0)], r"malformed verdict 'I think.* after 3 attempt\(s\)", 3,
     "malformed"),
    ([(200, "HTTP 503: the page timed out", 0.0)], r"malformed verdict 'HTTP 503.* after 3 attempt\(s\)", 3,
     "malformed"),                                                    # its own words never name another cause
    ([(200, verdict(facts=(True,)), 0.0), (200, verdict(), 0.0)], None, 2, None),        # retried, then judged
    ([(200, verdict(facts=(True,)), 0.0)], r"malformed verdict .*with 3 facts after 3 attempt\(s\)", 3, "malformed"),
    ([(200, verdict(blocked=True), 0.0)], "blocked page", 1, "blocked"),
    ([(200, {"role": "assistant", "content": None, "refusal": "I can't judge this."}, 0.0)],   # OpenAI's refusal
     r"declined to judge \(refusal \"I can't judge this.\"\) after 3 attempt\(s\)", 3, "refusal"),
    ([(200, verdict(), 2.0)], r"timed out \(.*timeout_s=0.3\) after 3 attempt\(s\)", 3, "timeout"),
], indirect=["endpoint"])
def test_every_judge_failure_is_an_env_failure_naming_its_cause_and_never_the_key(endpoint, cause, attempts, metric,
                                                                                  monkeypatch, caplog):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    judge = judge_of(endpoint, timeout_s=0.3)
    if cause is None:
        assert judge.judge(request()).reward == 1.0
    else:
        with pytest.raises(JudgeFailure, match=cause) as info:
            judge.judge(request())
        assert isinstance(info.value, EnvFailure) and KEY not in str(info.value)
        assert failure_cause(str(info.value)) == metric   # its judge/failures/<cause> in metrics.jsonl
        assert metric != "refusal" or "use another env.judge.model" in failure_fix(str(info.value), {})
    assert len(endpoint.bodies) == attempts and KEY not in caplog.text


@pytest.mark.parametrize("endpoint, check_blocked", [
    ([(200, verdict(matched=None), 0.0)], True),     # a reference answer the judge did not compare: not reward 0
    ([(200, verdict(blocked=True), 0.0)], False),    # blocked where the schema says false: not a blocked page
], indirect=["endpoint"])
def test_an_off_schema_verdict_is_malformed_never_a_score_or_a_blocked_page(endpoint, check_blocked, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    judge = judge_of(endpoint, check_blocked=check_blocked)
    with pytest.raises(JudgeFailure, match=r"malformed verdict .* after 3 attempt\(s\)") as info:
        judge.judge(request())
    assert failure_cause(str(info.value)) == "malformed" and len(endpoint.bodies) == 3
    if check_blocked:   # the same null is the schema's answer where there is no reference answer
        assert judge.judge(request(reference_answer=None, ground_truth=None)).reward == 1.0


@pytest.mark.parametrize("reference", ["4.20", None])
def test_a_verdict_with_a_key_the_schema_forbids_or_lacks_is_malformed(reference):
    """The schema (`verdict_schema`) has exactly its four keys: a verdict with another key, or without
    reference_matched, answers some other question and is never scored."""
    asked = request(reference_answer=reference)
    schema = verdict_schema(len(FACTS), reference=bool(reference))
    extra = dict(json.loads(verdict(matched=reference and True)), facts_met=[False] * 3)
    missing = {k: v for k, v in json.loads(verdict(matched=reference and True)).items() if k != "reference_matched"}
    assert set(extra) - set(schema["properties"]) and set(schema["required"]) - set(missing)
    for raw in (json.dumps(extra), json.dumps(missing)):
        with pytest.raises(MalformedVerdict, match="expected the verdict schema"):
            rubric_criteria(raw, asked, "judge-model")
    assert rubric_criteria(verdict(matched=reference and True), asked, "judge-model")[-1][1] is True


def test_a_dead_server_and_a_missing_key_are_judge_failures(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # closed again: nothing listens there
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    dead = ChatJudge(base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env="TEST_JUDGE_KEY", retries=1,
                     backoff_s=0.01)
    with pytest.raises(JudgeFailure, match=r"unreachable .*refused.* after 2 attempt") as info:
        dead.judge(request())
    assert failure_cause(str(info.value)) == "unreachable"
    monkeypatch.delenv("TEST_JUDGE_KEY")
    with pytest.raises(JudgeFailure, match="TEST_JUDGE_KEY holding its API key is not set") as info:
        dead.judge(request())
    assert failure_cause(str(info.value)) == "no_api_key"


@pytest.mark.parametrize("status", [301, 302, 303])
def test_a_redirecting_endpoint_is_a_judge_failure_and_the_key_never_follows_the_redirect(status, monkeypatch):
    """An endpoint that answers a redirect to another origin gets no second request: urllib would follow it as a GET
    carrying the Authorization header (the key) to wherever Location points; the failure names the new place."""
    seen = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(dict(self.headers))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

    class Redirect(Elsewhere):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(status)
            self.send_header("Location", f"http://127.0.0.1:{other.server_address[1]}/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

    other, redirecting = (http.server.ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (Elsewhere, Redirect))
    for server in (other, redirecting):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    judge = ChatJudge(base_url=f"http://127.0.0.1:{redirecting.server_address[1]}/v1", model="m",
                      api_key_env="TEST_JUDGE_KEY", backoff_s=0.01)
    try:
        with pytest.raises(JudgeFailure, match=rf"HTTP {status} \(redirected to http://127.0.0.1:"
                                               rf"{other.server_address[1]}/v1/chat/completions: set env.judge.url"
                                               rf" to the endpoint itself\) after 1 attempt") as info:
            judge.judge(request())
    finally:
        for server in (other, redirecting):
            server.shutdown()
            server.server_close()
    assert seen == [] and KEY not in str(info.value) and failure_cause(str(info.value)) == f"http_{status}"


def read_request(conn: socket.socket) -> bytes:
    """One HTTP request read whole from `conn`: its head, then the Content-Length bytes of its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(1 << 16)
    head, body = data.split(b"\r\n\r\n", 1)
    lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    while len(body) < int(lengths[0]):
        body += conn.recv(1 << 16)
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("reply", [b"+OK not an HTTP server\r\n",                                # another protocol
                                   b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"choices\": ["])   # cut short
def test_a_server_that_does_not_speak_http_or_cuts_its_answer_is_a_judge_failure(reply):
    """Retried like any transport fault, then a JudgeFailure (an env failure, never the agent's 0); the doctor's
    judge check reports it with its fix instead of raising."""
    server, connections = socket.socket(), []
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:   # the whole request read first: closing on unread bytes resets the connection (RST), and
                connections.append(read_request(conn))   # the judge would read 'unreachable', not the reply
                conn.sendall(reply)

    threading.Thread(target=answer, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    try:
        with pytest.raises(JudgeFailure, match=r"malformed response .* after 2 attempt\(s\)") as info:
            ChatJudge(base_url=url, model="m", retries=1, backoff_s=0.01, timeout_s=5.0).judge(request())
        assert failure_cause(str(info.value)) == "malformed" and len(connections) == 2
        report = check_judge({"backend": "chat", "url": url, "model": "m", "retries": 0, "timeout_s": 5.0})
        assert not report["ok"] and "does not answer OpenAI chat completions" in report["fix"]
    finally:
        server.close()


@pytest.mark.parametrize("trickled, every_s", [("body", 0.03), ("headers", 0.2)])
def test_an_answer_that_trickles_in_is_timed_out_within_its_timeout_not_after_it(trickled, every_s):
    """timeout_s bounds an attempt's whole time, not each read: a server that sends its (valid) verdict a byte every
    30 ms (4 s in all), or its headers a byte every 0.2 s (8 s), is a timeout after about 0.5 s (a JudgeFailure,
    never the agent's 0)."""
    body = json.dumps({"choices": [{"message": {"content": verdict()}}]}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    sent_whole, trickle_out = (head, body) if trickled == "body" else (b"", head + body)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def trickle():
        conn, _ = server.accept()
        with conn:
            conn.recv(1 << 20)
            try:
                conn.sendall(sent_whole)
                for i in range(len(trickle_out)):
                    conn.sendall(trickle_out[i:i + 1])
                    time.sleep(every_s)
            except OSError:
                pass   # the judge gave up

    threading.Thread(target=trickle, daemon=True).start()
    judge = ChatJudge(base_url=f"http://127.0.0.1:{server.getsockname()[1]}/v1", model="m", retries=0, timeout_s=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(JudgeFailure, match=r"timed out .* after 1 attempt") as info:
            judge.judge(request())
    finally:
        server.close()
    assert time.monotonic() - start < 1.5 and failure_cause(str(info.value)) == "timeout"


@pytest.mark.parametrize("endpoint", [[(200, verdict(), 0.3), (200, "bad", 0.3), (200, verdict(), 0.3),
                                       (200, verdict(), 0.3)]], indirect=True)
def test_the_pool_judges_a_batch_concurrently_and_keeps_failures_apart(endpoint, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    pool = JudgePool(judge_of(endpoint, retries=0), concurrency=4)
    try:
        results = pool.judge_batch([request() for _ in range(4)])
    finally:
        pool.close()
    assert sum(isinstance(r, JudgeFailure) for r in results) == 1 and sum(
        getattr(r, "reward", 0) == 1.0 for r in results) == 3
    assert endpoint.max_in_flight >= 2   # the requests overlapped at the server


@pytest.mark.browser
@pytest.mark.parametrize("endpoint", [[(200, verdict(), 0.0), (200, "not json", 0.0)]], indirect=True)
def test_a_webgym_episode_is_rewarded_by_the_chat_judge_and_a_bad_verdict_is_an_env_failure(endpoint, monkeypatch):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    spec = env_specs("sites")[0]     # shop-price-00: three facts, the answer 62.42
    settings = {"backend": "chat", "url": endpoint.url, "model": "judge-model", "api_key_env": "TEST_JUDGE_KEY",
                "retries": 0}
    env = make_env(spec, screenshot_size=(128, 96), judge=settings)
    try:
        env.reset(0)
        env.step("click(500, 500)")
        result = env.step('answer("the agent guesses")')    # the (scripted) judge, not the ground truth, decides
        assert result.terminated and result.reward == 1.0 and result.info["judge_backend"] == "chat"
        assert result.info["verdict"][0] == ["B: the screenshots support the answer", True]
        images = [c for c in endpoint.bodies[0]["messages"][1]["content"] if c["type"] == "image_url"]
        assert len(images) == 2 and result.info["judged_steps"] == [0, 1]   # the two pages the agent saw
        env.reset(1)
        with pytest.raises(JudgeFailure, match="malformed verdict 'not json'"):
            env.step('answer("62.42")')
    finally:
        env.close()
    ground = make_env(spec, screenshot_size=(128, 96))          # no judge settings: the ground truth
    try:
        ground.reset(0)
        result = ground.step('answer("62.42")')
        assert result.reward == 1.0 and result.info["judge_backend"] == "ground_truth"
    finally:
        ground.close()


def test_the_run_config_carries_the_judge_to_the_workers_and_refuses_an_incomplete_one(tmp_path):
    config = base.config()
    base.SCALES[base.variant("toy")](config)
    assert "judge" not in worker_spec(config, buffer_path="b", address="tcp://127.0.0.1:1", token="t",
                                      stats_dir=None)["worker"]["env_options"]
    config.env.judge.backend = "chat"
    with pytest.raises(ConfigError, match=r"^env\.judge\.backend='chat': the chat judge needs env\.judge\.url"):
        validate(config, str(tmp_path))
    config.env.judge.url, config.env.judge.model = "http://127.0.0.1:9/v1", "m"
    options = worker_spec(config, buffer_path="b", address="tcp://127.0.0.1:1", token="t",
                          stats_dir=None)["worker"]["env_options"]
    assert options["judge"]["backend"] == "chat" and options["judge"]["url"] == "http://127.0.0.1:9/v1"
    config.env.judge.max_screenshots = 8   # a vLLM server's --limit-mm-per-prompt
    options = worker_spec(config, buffer_path="b", address="tcp://127.0.0.1:1", token="t",
                          stats_dir=None)["worker"]["env_options"]
    assert make_judge(options["judge"]).max_screenshots == 8


def test_the_engine_judge_is_refused_where_it_cannot_run(tmp_path):
    config = base.config()
    base.SCALES[base.variant("toy")](config)
    config.env.judge.backend = "engine"
    validate(config, str(tmp_path))   # the tiny JAX server, 64 x 64 screenshots: fits
    config.rollout.engine = "vllm"
    with pytest.raises(ConfigError, match=r"^env\.judge\.backend='engine': .*needs rollout\.engine='jax'"):
        validate(config, str(tmp_path))
    config.rollout.engine, config.rollout.continuous_batching = "jax", True
    validate(config, str(tmp_path))   # continuous batching serves verdicts too (rollout/continuous_server.py)
    config.env.screenshot_width, config.env.screenshot_height = 1280, 720
    with pytest.raises(ConfigError, match=r"^env\.judge\.max_screenshots=48: .*at 1280x720 set it to at most 5$"):
        validate(config, str(tmp_path))
    with pytest.raises(ValueError, match="own policy server"):   # only a run's workers know where it is
        make_judge({"backend": "engine"})
