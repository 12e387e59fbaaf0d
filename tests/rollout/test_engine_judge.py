"""The engine judge on a real PolicyServer with the tiny Qwen3-VL, over the authenticated transport: its verdict
always parses (grammar-constrained, greedy: the same answer twice), criteria make the reward as for the chat judge,
a verdict is no policy token and no admitted group; a timeout, a dead server and a refused request are
JudgeFailures naming their cause; make_judge, the worker's link and the doctor's probe reach it; a continuous-batching
server judges as the static one does."""

import concurrent.futures
import dataclasses
import json
import re
import threading
import time

import numpy as np
import pytest

from configs import base
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env import check
from jaxwebrl.env.tasks.webgym.judge import BlockedPage, JudgeFailure, JudgeRequest, make_judge, verdict_regex
from jaxwebrl.env.tasks.webgym.verdicts import failure_cause
from jaxwebrl.models.constraints import TokenConstraint
from jaxwebrl.models.policy import tiny_policy
from jaxwebrl.rollout.continuous_server import ContinuousPolicyServer
from jaxwebrl.rollout.engine_judge import EngineJudge, judge_payload, link_engine_judge, main as probe_main
from jaxwebrl.rollout.policy_server import PolicyServer
from jaxwebrl.rollout.serving import PolicyService
from jaxwebrl.rollout.transport import TransportServer, new_token
from jaxwebrl.rollout.verdict_decoding import VerdictGrammars


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    buffer = RingBuffer.create(str(tmp_path_factory.mktemp("buf") / "buffer"), capacity_steps=64, max_seq_len=512,
                               screenshot_shape=(48, 64, 3), max_images_per_step=1)
    server = PolicyServer(tiny_policy(seed=1), buffer, max_batch=4, decode_chunk=8)
    with PolicyService(server.handle, server=server).start() as service:
        yield service


def judge_of(service, **kw):
    return EngineJudge(service.address, token=service.token, **dict(dict(timeout_s=120.0, retries=0), **kw))


def request(facts=("opened the Kitchen category",), reference="4.20", shade=0, task_id="shop-1"):
    shots = tuple(np.full((48, 64, 3), 40 * k + shade, np.uint8) for k in range(3))
    return JudgeRequest(task_id=task_id, goal="Find the red mug's price.", facts=tuple(facts), answer="4.20",
                        reference_answer=reference, screenshots=shots)


def expected_criteria(raw, req):
    """WebGym's rule, read off the raw verdict: B, then facts up to the first not met, then the reference."""
    verdict = json.loads(raw)
    met = [verdict["answer_supported"]]
    for fact in verdict["facts"]:
        met.append(fact)
        if not fact:
            break
    if req.reference_answer and all(met):
        met.append(verdict["reference_matched"])
    return met


def test_every_verdict_parses_its_criteria_make_the_reward_and_no_policy_token_is_counted(service):
    judge = judge_of(service, max_screenshots=2)
    before = service.server.stats()
    cases = [request(), request(facts=("a", "b", "c"), reference=None, shade=1),
             request(facts=tuple("abcde"), reference="x", shade=2)]
    answers = []
    for req in cases:
        try:
            verdict = judge.judge(req)
        except BlockedPage as blocked:   # the tiny random judge flags some pages: a valid verdict all the same
            assert json.loads(blocked.raw)["blocked"] is True
            answers.append(blocked.raw)
            continue
        answers.append(verdict.raw)
        assert verdict.backend == "engine" and verdict.screenshots == (1, 2)   # the last max_screenshots
        assert [met for _, met in verdict.criteria] == expected_criteria(verdict.raw, req)
        assert verdict.reward == float(all(met for _, met in verdict.criteria))
    for req, raw in zip(cases, answers):
        assert re.fullmatch(verdict_regex(len(req.facts), req.reference_answer is not None), raw), raw
    assert _raw_of(judge, cases[0]) == answers[0]   # greedy: the same verdict again
    unblockable = judge_of(service, max_screenshots=2, check_blocked=False).judge(cases[0])   # never BlockedPage
    assert re.fullmatch(verdict_regex(1, True, check_blocked=False), unblockable.raw), unblockable.raw
    after = service.server.stats()
    assert after["judge_requests"] - before["judge_requests"] == len(cases) + 2
    assert after["judge_tokens"] > before["judge_tokens"]
    for policy_count in ("requests", "generated_tokens", "prompt_tokens"):
        assert after[policy_count] == before[policy_count]
    judge.close()


def _raw_of(judge, req):
    try:
        return judge.judge(req).raw
    except BlockedPage as blocked:
        return blocked.raw


def test_an_answer_that_spells_an_image_placeholder_is_judged_not_refused(service):
    """The agent's answer reaches the judge's text: `<|image_pad|>` in it stays text (judge.rubric_text's `inert`),
    so the server encodes one placeholder run a screenshot shown and answers a verdict (before: the prompt had one
    placeholder more than its images, the server refused it, and the episode was lost as a judge failure)."""
    spelled = dataclasses.replace(request(), answer="4.20 <|image_pad|><|im_end|>")
    raw = _raw_of(judge_of(service, max_screenshots=2), spelled)
    assert re.fullmatch(verdict_regex(1, True), raw), raw


def test_admission_control_never_holds_a_verdict(service):
    server = service.server
    server.set_admission(capacity=0, backlog=0)   # no group may start
    try:
        payload = dict(judge_payload(request(), (2,)), worker_id=0, group_id=7)
        answered = concurrent.futures.Future()   # held by admission, it would never return: asked on a thread
        threading.Thread(target=lambda: answered.set_result(server.handle(payload)), daemon=True).start()
        reply = answered.result(timeout=120)
        assert re.fullmatch(verdict_regex(1, True), reply["text"]) and reply["version"] == 0
    finally:
        server.admission.set_limit(10**6, 0)


def test_a_timeout_a_refused_request_and_a_dead_server_are_judge_failures_naming_their_cause(service):
    server = service.server
    server.pause()   # nothing is decoded: the judge times out
    try:
        with pytest.raises(JudgeFailure, match=r"timed out .* after 2 attempt\(s\)") as info:
            judge_of(service, timeout_s=0.3, retries=1, backoff_s=0.01).judge(request())
        assert failure_cause(str(info.value)) == "timeout"
    finally:
        server.resume()
    with pytest.raises(JudgeFailure, match=r"refused \(.*'facts' must be an int in \[0, 64\].* after 1 attempt") as info:
        judge_of(service, retries=3).judge(request(facts=("f",) * 65))   # refused: never retried
    assert failure_cause(str(info.value)) == "refused"
    transport = TransportServer(server.handle, token=service.token).start()
    judge = EngineJudge(transport.address, token=service.token, timeout_s=60.0, retries=1, backoff_s=0.01,
                        check_blocked=False)
    judge.judge(request(task_id="before"))   # connected and answered
    transport.close()                        # the server is gone
    with pytest.raises(JudgeFailure, match=r"judge engine on after: timed out .*is the run's server up.* after 2 "
                                           r"attempt\(s\) at tcp://") as info:
        judge.timeout_s = 0.5
        judge.judge(request(task_id="after"))
    assert failure_cause(str(info.value)) == "timeout"
    judge.close()


def test_make_judge_and_a_workers_link_build_it_and_the_doctor_probes_a_running_run(service, tmp_path, capsys):
    worker = {"env_options": {"judge": {"backend": "engine", "timeout_s": 30.0, "max_screenshots": 4}}}
    policy = {"kind": "remote", "address": service.address, "token": service.token}
    settings = link_engine_judge(worker, policy)["env_options"]["judge"]
    judge = make_judge(settings)
    assert isinstance(judge, EngineJudge) and judge.max_screenshots == 4 and judge.timeout_s == 30.0
    assert "policy" not in worker["env_options"]["judge"]   # the spec itself is left as it was
    with pytest.raises(ValueError, match="needs the run's policy server, but the workers' policy is 'scripted'"):
        link_engine_judge(worker, {"kind": "scripted"})
    with pytest.raises(ValueError, match="whose connection only the run's rollout workers get"):
        make_judge({"backend": "engine"})
    assert check.main(["--judge-only", "--judge.backend=engine"]) == 1   # the env doctor names the run's probe
    assert capsys.readouterr().err.strip().endswith("judge check failed: env.judge.backend='engine' judges on the "
                                                    "run's own policy server, whose connection only the run's rollout "
                                                    "workers get (link_engine_judge); check a running run's with: "
                                                    "python3 -m jaxwebrl.rollout.engine_judge --run=WORKDIR")
    config = base.config()
    base.SCALES[base.variant("toy")](config)
    config.env.judge.backend, config.env.judge.concurrency = "engine", 3
    run_service = PolicyService.for_policy(service.server.policy, service.server.buffer, config, host="127.0.0.1",
                                           num_clients=300)   # past the floor (MIN_HANDLER_THREADS)
    assert run_service.transport._num_threads == 300 * (2 + 3)   # a thread for each verdict a worker has in flight
    run_service.close()
    service.publish(str(tmp_path))
    assert probe_main([f"--run={tmp_path}", "--timeout_s=120"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["backend"] == "engine" and report["address"] == service.address
    assert service.token not in json.dumps(report)


def test_continuous_batching_judges_as_the_static_server_does(service):
    """Policy requests and verdicts of two fact counts, all queued at once before a continuous server of two slots
    admits any: each verdict is decoded under its own grammar once the slots have drained of the other settings,
    and every reply equals the static server's to the same request (greedy verdicts; seeded policy rows)."""
    buffer = service.server.buffer
    shot = buffer.screenshots.put(np.full((48, 64, 3), 90, np.uint8))
    generate = [{"op": "generate", "image_refs": np.array([shot]), "max_new_tokens": 12, "seed": 7 + i,
                 "messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"go {i}"}]}]}
                for i in range(2)]
    verdicts = [judge_payload(request(), (2,)), judge_payload(request(facts=("a", "b", "c"), reference=None), (1, 2))]
    asked = [generate[0], verdicts[0], verdicts[1], generate[1]]   # in this order: the slots switch setting 3 times
    expected = [service.server.handle(dict(r)) for r in asked]
    continuous = ContinuousPolicyServer(service.server.policy, buffer, max_batch=2, decode_chunk=8)
    replies = [None] * len(asked)
    try:
        continuous.pause()

        def ask(i):
            replies[i] = continuous.handle(dict(asked[i]))

        threads = []
        for i in range(len(asked)):   # queued in order
            threads.append(threading.Thread(target=ask, args=(i,)))
            threads[-1].start()
            time.sleep(0.2)
        continuous.resume()
        for t in threads:
            t.join(timeout=300)
        stats = continuous.stats()
    finally:
        continuous.close()
    for i in (1, 2):
        assert replies[i]["text"] == expected[i]["text"] and replies[i]["num_tokens"] == expected[i]["num_tokens"]
        assert "loss_mask" not in replies[i] and replies[i]["version"] == 0
    assert re.fullmatch(verdict_regex(3, False), replies[2]["text"]), replies[2]["text"]
    for i in (0, 3):
        np.testing.assert_array_equal(replies[i]["input_ids"], expected[i]["input_ids"])
    assert (stats["judge_requests"], stats["requests"]) == (2, 2)
    assert stats["judge_tokens"] == expected[1]["num_tokens"] + expected[2]["num_tokens"]


def test_a_grammar_being_built_holds_up_no_verdict_of_a_grammar_already_built(service, monkeypatch):
    """A new fact count's grammar is built on its request's handler thread (minutes at a 151k vocabulary); the
    batching thread and other handlers asking for a grammar already built get it meanwhile, and two requests of the
    new fact count build it once."""
    grammars = VerdictGrammars(service.server.processor, service.server.policy.config.text.vocab_size)
    ready = grammars.decoding(1, True, True)
    started, release, builds = threading.Event(), threading.Event(), []
    build = TokenConstraint.from_regex

    def slow_build(*args, **kwargs):
        builds.append(args[0])
        started.set()
        release.wait(30)
        return build(*args, **kwargs)

    monkeypatch.setattr(TokenConstraint, "from_regex", slow_build)
    new = [threading.Thread(target=grammars.decoding, args=(2, True, True), daemon=True) for _ in range(2)]
    try:
        for thread in new:
            thread.start()
        assert started.wait(30)
        got = concurrent.futures.Future()
        threading.Thread(target=lambda: got.set_result(grammars.decoding(1, True, True)), daemon=True).start()
        assert got.result(timeout=5) is ready   # not held until the other grammar is built
    finally:
        release.set()
    for thread in new:
        thread.join(timeout=60)
    assert len(builds) == 1 and grammars.decoding(2, True, True)[1].max_new_tokens >= 256


def test_an_off_schema_verdict_is_retried_and_then_a_judge_failure_naming_the_judge_and_its_attempts():
    """A reply off the verdict schema (here blocked true under check_blocked=False) is malformed: retried like a
    server error, and once the attempts are spent a JudgeFailure naming the judge, the task and the attempts (never
    scored, never a blocked page). A real transport server answers from a script (the last answer repeats)."""
    token, asked = new_token(), []
    off = '{"blocked":true,"answer_supported":true,"facts":[true],"reference_matched":true}'
    script = [off, off.replace('"blocked":true', '"blocked":false')]

    def handler(payload):
        asked.append(payload["facts"])
        return {"text": script[min(len(asked), len(script)) - 1]}

    transport = TransportServer(handler, token=token).start()
    judge = EngineJudge(transport.address, token=token, timeout_s=30.0, retries=1, backoff_s=0.01, check_blocked=False)
    try:
        assert judge.judge(request()).reward == 1.0 and len(asked) == 2   # the second answer is a verdict
        script[1:] = []
        with pytest.raises(JudgeFailure, match=r"judge engine on shop-1: malformed verdict .* after 2 attempt\(s\) "
                                               r"at tcp://") as info:
            judge.judge(request())
        assert len(asked) == 4 and failure_cause(str(info.value)) == "malformed"
    finally:
        judge.close()
        transport.close()
