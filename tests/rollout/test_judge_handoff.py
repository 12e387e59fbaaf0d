"""A WebGym episode's verdict is handed off: a rollout worker in Chromium plays its next episodes while the judge has
not answered, and each lands in the ring buffer (from the worker's lander thread) with its verdict's reward, the
verdict, the judge's raw answer and the screenshots judged once the judge answers; a judge failure is an env failure
in its slot. The trainer's judge
metrics come from those verdicts, and `python3 -m jaxwebrl.eval.judge` re-judges the saved run."""

import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
import types

import pytest

from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env.registry import check_env_spec, env_specs
from jaxwebrl.env.tasks.webgym.env import WebGymEnv
from jaxwebrl.env.tasks.webgym.judge import GroundTruthJudge, JudgeFailure, JudgePool, Verdict
from jaxwebrl.env.tasks.webgym.webgym_tasks import load_task_line
from jaxwebrl.eval import judge as rejudging
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.buffer.schema import BufferWriteError
from jaxwebrl.rollout.awaiting import AwaitingEpisodes, BufferUnusable
from jaxwebrl.rollout.rate_limited_log import RateLimitedLog
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend
from jaxwebrl.rollout.worker import RolloutWorker, WorkerConfig
from jaxwebrl.train.gatherer import BatchGatherer

SPEC = env_specs("sites")[0]     # shop-price-00: the ground truth is 62.42
# One worker plays G = 3 episodes: a click then the right answer; a wrong answer; an answer the judge fails on.
ACTIONS = ["click(500, 500)", 'answer("62.42")', 'answer("1.00")', 'answer("7.77")']


class GatedJudge:
    """The ground truth, answering once `gate` is set, as a judge that looked at every screenshot; a timeout on
    the answer 7.77."""

    backend = "gated"

    def __init__(self, gate: threading.Event):
        self.gate, self.asked = gate, []

    def judge(self, request):
        start = time.perf_counter()
        self.asked.append(request.answer)
        assert self.gate.wait(20), "the test never opened the gate"
        if request.answer == "7.77":
            raise JudgeFailure(f"judge gated on {request.task_id}: timed out after 1 attempt(s) at http://judge")
        verdict = GroundTruthJudge().judge(request)
        return dataclasses.replace(verdict, backend=self.backend, seconds=time.perf_counter() - start,
                                   screenshots=tuple(range(len(request.screenshots))))


class YesJudge:
    """A judge that passes every episode."""

    backend = "yes"

    def __init__(self):
        self.screenshots = []

    def judge(self, request):
        self.screenshots.append(len(request.screenshots))
        return Verdict((("everything is fine", True),), '{"ok": true}', self.backend, 0.0)


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def eventually(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_lander_appends_episodes_as_their_verdicts_come_the_limit_bounds_them_and_close_drops_the_rest(caplog):
    landed, steps = [], [types.SimpleNamespace(ref=11), types.SimpleNamespace(ref=12)]
    awaiting = AwaitingEpisodes(lambda parts, *outcome: landed.append((parts["n"], *outcome)), who="worker 5",
                                warn=RateLimitedLog(logging.getLogger("test"), 30.0), limit=2)
    verdicts = [concurrent.futures.Future() for _ in range(4)]
    for n in range(3):
        if n == 2:
            eventually(lambda: landed)
        awaiting.add(verdicts[n], {"n": n, "steps": steps, "task_id": "t"})
        if n == 0:
            verdicts[1].set_result((1.0, {"success": True, "judge_s": 0.5, "judged_steps": [1]}))
    # episode 1 landed by itself, on the lander thread, while 0 still waits
    assert landed == [(1, 1.0, {"judge_s": 0.5, "judged_steps": [1], "judged_refs": [12]}, None)]
    failure = "JudgeFailure: judge m on t: HTTP 503 after 3 attempt(s)"
    threading.Timer(0.3, verdicts[0].set_exception, [JudgeFailure(failure.split(": ", 1)[1])]).start()
    start = time.monotonic()
    awaiting.add(verdicts[3], {"n": 3, "steps": steps, "task_id": "t"})   # 0 and 2 wait: the limit waits for one
    assert time.monotonic() - start >= 0.2 and landed[1] == (0, 0.0, {"judge_failure": failure}, failure)
    verdicts[2].set_result((0.0, {"judge_s": 0.1, "judged_steps": []}))
    eventually(lambda: len(landed) == 3)
    counts = awaiting.take_counts()
    assert counts.pop("buffer_s") >= 0 and counts == {"verdicts": 2, "successes": 1, "judge_failures": 1,
                                                      "env_failures": 1, "episodes": 3}
    with caplog.at_level(logging.WARNING):
        assert awaiting.close(0.1) == 1 and len(awaiting) == 0   # verdict 3 never comes
    assert [n for n, *_ in landed] == [1, 0, 2] and "worker 5: 1 episodes dropped at close" in caplog.text


def test_close_drops_only_what_it_says_and_the_lander_lands_nothing_after_it():
    """Three verdicts came; the lander is inside the first (slow) append when close gives up waiting. close said all
    three were dropped, then the lander went on through the list it had taken and appended all three after close:
    every episode was counted both dropped and landed (stats.dropped_episodes, the log line), and appends ran on
    while the worker process was exiting. Now the one under way lands, the other two are dropped and stay so."""
    release, appended = threading.Event(), []

    def slow_append(parts, *outcome):
        appended.append(parts["n"])
        release.wait(5)

    awaiting = AwaitingEpisodes(slow_append, who="worker 2", warn=RateLimitedLog(logging.getLogger("test"), 30.0))
    for n in range(3):
        done = concurrent.futures.Future()
        done.set_result((1.0, {"success": True}))
        awaiting.add(done, {"n": n, "steps": [], "task_id": "t"})
    eventually(lambda: appended)                 # the lander is inside its first append
    threading.Timer(0.5, release.set).start()   # which ends after close has given up
    dropped = awaiting.close(0.1)
    assert not release.is_set(), "close waited past the append: the test cannot tell anything"
    eventually(lambda: not awaiting._lander.is_alive())
    assert appended == [0] and dropped == 2, (appended, dropped)


def test_a_buffer_that_keeps_refusing_judged_episodes_stops_the_worker():
    def refuse(*args):
        raise BufferWriteError("disk full at /buffer: free space")

    awaiting = AwaitingEpisodes(refuse, who="worker 1", warn=RateLimitedLog(logging.getLogger("test"), 30.0),
                                max_buffer_failures=2)
    for n in range(2):
        done = concurrent.futures.Future()
        done.set_result((1.0, {"judge_s": 0.1}))
        awaiting.add(done, {"n": n, "steps": [], "task_id": "t"})
    with pytest.raises(BufferUnusable, match="2 judged episodes in a row could not be appended; last: disk full"):
        awaiting.land(timeout_s=5)
    assert awaiting.take_counts()["buffer_failures"] == 2
    awaiting.close(0.1)


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory):
    """The run's workdir after one group, and what was true while the judge had not answered."""
    workdir = tmp_path_factory.mktemp("run")
    buffer = RingBuffer.create(str(workdir / "buffer"), capacity_steps=64, max_seq_len=1024,
                               screenshot_shape=(64, 64, 3), max_images_per_step=2)
    checked = check_env_spec(SPEC)
    path, _, number = checked.source.rpartition(":")
    task, gate, envs = load_task_line(path, int(number)), threading.Event(), []
    judge = GatedJudge(gate)
    pool = JudgePool(judge, concurrency=4)

    def factory(spec):
        envs.append(WebGymEnv(checked, task, pool, hand_off_verdicts=True, screenshot_size=(64, 64)))
        return envs[-1]

    actions = iter(ACTIONS)
    backend = ScriptedBackend(lambda request, rng: (f"Memory: {{}}\nAction: {next(actions)}", 0.0),
                              processor=tiny_processor(), fetch_image=buffer.screenshots.get, version=2, seed=0)
    config = WorkerConfig(tasks=(SPEC,), group_size=3, max_new_tokens=64, prompt={"window": 1})
    worker = RolloutWorker(config, InProcessClient(backend), buffer, env_factory=factory)
    lines, log = Lines(), logging.getLogger("jaxwebrl.rollout.worker")
    log.addHandler(lines)
    try:
        appended_now = worker.run_group(SPEC, 0)
        before = {"appended": appended_now, "in_buffer": len(buffer.read(None).episodes), "asked": list(judge.asked),
                  "steps": worker.stats.steps, "awaiting": worker.stats.awaiting_verdicts}
        gate.set()   # the episodes land with no call on the worker's thread (it could be waiting on the policy)
        eventually(lambda: len(buffer.read(None).episodes) == 3, timeout_s=20)
        left = worker.land_verdicts(timeout_s=20)
    finally:
        log.removeHandler(lines)
        worker.close()
        pool.close()
    yield {"workdir": workdir, "before": before, "left": left, "stats": worker.stats, "envs": len(envs),
           "lines": lines.lines}


@pytest.mark.browser
def test_the_browser_plays_on_while_the_judge_has_not_answered_and_each_episode_lands_with_its_verdict(judged_run):
    before = judged_run["before"]
    # all three episodes were played, each asked the judge, and none waited for its verdict
    assert before["steps"] == 4 and sorted(before["asked"]) == ["1.00", "62.42", "7.77"]
    assert before["appended"] == [] and before["in_buffer"] == 0 and before["awaiting"] == 3
    assert judged_run["left"] == 0 and judged_run["stats"].awaiting_verdicts == 0
    buffer = RingBuffer.open(str(judged_run["workdir"] / "buffer"))
    result = buffer.read(None, group_size=3)
    assert len(result.groups) == 1 and len(result.episodes) == 3   # the group is whole
    by_answer = {e.info["judge"].get("judge_request", {}).get("answer"): e for e in result.episodes}
    right, wrong, failed = by_answer["62.42"], by_answer["1.00"], by_answer[None]
    assert right.reward == 1.0 and right.terminated and not right.env_failed
    assert wrong.reward == 0.0 and wrong.terminated and not wrong.env_failed
    saved = right.info["judge"]
    assert saved["verdict"] == [["answer matches the ground truth", True]] and saved["judge_backend"] == "gated"
    assert json.loads(saved["judge_raw"]) == {"answer": "62.42"} and saved["judge_s"] >= 0
    assert saved["judged_steps"] == [0, 1] and saved["judged_refs"] == rejudging.step_screenshot_refs(right)
    assert wrong.info["judge"]["judged_refs"] == rejudging.step_screenshot_refs(wrong)
    # the judge failure: env-failed in its slot, never scored, named in one log line; the browser was not restarted
    assert failed.env_failed and failed.reward == 0.0 and "JudgeFailure" in failed.info["env_failure"]
    assert "timed out" in failed.info["judge"]["judge_failure"]
    stats = judged_run["stats"]
    assert (stats.verdicts, stats.judge_failures, stats.env_failures, stats.episodes) == (2, 1, 1, 3)
    assert judged_run["envs"] == 1
    assert [line for line in judged_run["lines"] if "judge failed" in line and "timed out" in line]


@pytest.mark.browser
def test_the_judge_metrics_come_from_the_runs_verdicts(judged_run):
    buffer = RingBuffer.open(str(judged_run["workdir"] / "buffer"))
    result = buffer.read(None, group_size=3)
    gatherer = BatchGatherer(consumer_batch_size=3, max_head_offpolicyness=4)
    gatherer.add_groups(result.groups)
    metrics = gatherer.counts.as_metrics()
    seconds = sorted(e.info["judge"]["judge_s"] for e in result.episodes if not e.env_failed)
    assert seconds[0] > 0   # each verdict waited for the gate
    assert metrics["judge/verdicts"] == 2 and metrics["judge/failures"] == 1
    assert metrics["judge/failures/timeout"] == 1
    assert metrics["judge/latency_s/mean"] == pytest.approx(sum(seconds) / 2)
    assert seconds[0] <= metrics["judge/latency_s/p95"] <= seconds[1]
    assert not any("agree" in key for key in metrics)
    unjudged = BatchGatherer(consumer_batch_size=1, max_head_offpolicyness=1).counts.as_metrics()
    assert not any(key.startswith("judge/") for key in unjudged)   # a run without judged episodes: no judge key


@pytest.mark.browser
def test_rejudging_with_the_ground_truth_reproduces_the_verdicts_and_another_judge_disagrees(judged_run, capsys):
    workdir = judged_run["workdir"]
    assert rejudging.main([f"--run={workdir}", "--judge.backend=ground_truth"]) == 0
    table = json.loads((workdir / "rejudge_ground_truth.json").read_text())
    assert table["episodes"] == 2 and table["not_judged"] == 1 and table["agreement"] == 1.0
    assert table["same_criteria"] == 2 and (table["both_pass"], table["both_fail"]) == (1, 1)
    assert table["ground_truth_failures"] == 1 and table["false_positive_rate"] == {"original": 0.0, "new": 0.0}
    assert "agreement 1.0" in capsys.readouterr().out
    buffer = RingBuffer.open(str(workdir / "buffer"))
    yes = YesJudge()
    pool = JudgePool(yes)
    try:
        table = rejudging.rejudge(buffer.read(None).episodes, pool, buffer.screenshots.get)
    finally:
        pool.close()
    assert (table["only_new"], table["only_original"], table["agreement"]) == (1, 0, 0.5)
    assert table["false_positive_rate"] == {"original": 0.0, "new": 1.0} and table["same_criteria"] == 0
    assert sorted(yes.screenshots) == [1, 2]   # each episode's own screenshots, read back from the buffer
    assert rejudging.main([f"--run={workdir}", "--judge.backend=chat"]) == 2
