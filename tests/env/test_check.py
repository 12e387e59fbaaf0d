"""The doctor command prints a JSON report and its exit code says whether the setup works."""

import json

import pytest

from jaxwebrl.env import check
from jaxwebrl.env.tasks.webgym.judge_probe import VLLM_STRUCTURED
from tests.env.test_judge import KEY, Endpoint, verdict


@pytest.mark.browser
def test_doctor_reports_success_and_timings(capsys):
    rc = check.main(["--tasks", "miniwob/click-test,miniwob/enter-text", "--episodes", "2", "--screenshot-size", "80x105"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"], report
    assert set(report["tasks"]) == {"miniwob/click-test", "miniwob/enter-text"}
    assert report["tasks"]["miniwob/enter-text"] == {"success_rate": 1.0, "episodes": 2, "mean_steps": 2.0}
    assert report["chromium"] and report["chromedriver"] and report["request_guard"] is True
    assert report["allowlist"] == {"page_works": True, "navigate_refused": True, "subresource_blocked": True,
                                   "outside_requests": 0, "websocket_allowed_works": True,
                                   "websocket_outside_connections": 0, "webrtc_ran": True, "udp_packets": 0,
                                   "enforced": True}
    for key in ("reset", "screenshot", "action"):
        assert report["timings_ms"][key]["count"] > 0 and report["timings_ms"][key]["mean"] > 0


@pytest.mark.browser
def test_doctor_fails_below_threshold(capsys):
    assert check.main(["--tasks", "miniwob/click-test", "--episodes", "1", "--threshold", "1.01"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


@pytest.mark.browser
def test_doctor_plays_the_chain_family_and_the_long_miniwob_tasks(capsys):
    rc = check.main(["--tasks", "chain/easy-recall,chain/medium?trap=1,miniwob/choose-date", "--episodes", "2",
                     "--screenshot-size", "64x64"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"], report
    assert report["tasks"]["chain/easy-recall"] == {"success_rate": 1.0, "episodes": 2, "mean_steps": 3.0}
    assert report["tasks"]["chain/medium?trap=1"] == {"success_rate": 1.0, "episodes": 2, "mean_steps": 5.0}
    assert report["tasks"]["miniwob/choose-date"]["success_rate"] == 1.0


def test_doctor_checks_every_new_task_by_default_and_a_judge_beside_them(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(check, "run_check", lambda tasks, episodes, size: seen.update(tasks=tasks) or
                        {"errors": [], "success_rate": 1.0})
    assert check.main(["--judge.backend=ground_truth"]) == 0
    judge = json.loads(capsys.readouterr().out)["judge"]
    assert judge["ok"] and judge["reward"] == 1.0 and judge["latency_s"] >= 0   # the probe's answer is its truth
    assert {"toy", "miniwob/click-checkboxes-large", "miniwob/choose-date", "chain/easy", "chain/medium-cue",
            "chain/hard-recall"} <= set(seen["tasks"])


@pytest.mark.parametrize("script, flags, cause, fix", [
    ([(200, "The agent did well.", 0.0)], [], "malformed verdict 'The agent did well.'", VLLM_STRUCTURED),
    ([(200, "The page was unreachable", 0.0)], [], "malformed verdict 'The page was unreachable'", VLLM_STRUCTURED),
    ([(200, verdict(facts=(True,)), 1.0)], ["--judge.timeout_s=0.2"], "s > timeout_s=0.2) after 1 attempt",
     "no answer within env.judge.timeout_s=0.2: raise it"),
    ([(401, "", 0.0)], [], "HTTP 401", "export a valid one in TEST_JUDGE_KEY"),
    ([(404, "", 0.0)], [], "HTTP 404", "env.judge.url ends in /v1"),
])
def test_the_doctor_names_a_judges_failure_and_its_fix_in_one_line(script, flags, cause, fix, monkeypatch, capsys):
    monkeypatch.setenv("TEST_JUDGE_KEY", KEY)
    endpoint = Endpoint(script)
    try:
        rc = check.main(["--judge-only", "--judge.backend=chat", f"--judge.url={endpoint.url}", "--judge.model=m",
                         "--judge.api_key_env=TEST_JUDGE_KEY", "--judge.retries=0", *flags])
    finally:
        endpoint.close()
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert rc == 1 and not report["ok"] and cause in report["judge"]["cause"] and fix in report["judge"]["fix"]
    assert err.count("\n") == 1 and cause in err and fix in err and KEY not in out + err


def test_the_doctor_refuses_an_incomplete_judge(capsys):
    assert check.main(["--judge-only", "--judge.backend=chat", "--judge.model=m"]) == 1
    assert "needs env.judge.url and env.judge.model" in json.loads(capsys.readouterr().out)["judge"]["cause"]


@pytest.mark.parametrize("argv", [["--judge-only"], ["--judge.url", "http://127.0.0.1:9/v1"],
                                  ["--tasks", "miniwob/book-flight"], ["--tasks", "no-such-task"], ["--episodes", "0"],
                                  ["--screenshot-size", "big"], ["--tasks", "chain/easy?trap=9"],
                                  ["--judge-only", "--judge.backend=chat", "--judge.url=http://127.0.0.1:9/v1",
                                   "--judge.model=m", "--judge.retries=-1"],      # env.judge.retries' own check
                                  ["--judge-only", "--judge.backend=ground_truth", "--judge.timeout_s=0"]])
def test_doctor_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        check.main(argv)
    assert exit_info.value.code == 2
    if any(a.startswith("--judge.retries") or a.startswith("--judge.timeout_s") for a in argv):
        assert "must be" in capsys.readouterr().err   # the config field's own fix, in one line
