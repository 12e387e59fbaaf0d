"""The evaluation report scores only played episodes: env-failed and cut ones are counted apart."""

import math

from jaxwebrl.eval.probe import greedy_success
from jaxwebrl.eval.report import markdown, summarize
from tests.buffer.factory import make_episode


def _episode(seed, reward, **flags):
    flags = dict({"terminated": False, "truncated": False}, **flags)
    return make_episode(seed, task_id="miniwob/click-test", reward=reward, screenshots=None,
                        info={"instance_seed": seed}, **flags)


def test_cut_and_env_failed_episodes_are_counted_not_scored():
    episodes = [_episode(0, 1.0, terminated=True), _episode(1, 0.0, truncated=True),
                _episode(2, 0.0, truncated=True, cut=True), _episode(3, 0.0, truncated=True, env_failed=True)]
    report = summarize(episodes)
    overall = report["overall"]
    assert overall["episodes"] == 2 and overall["success_rate"] == 0.5     # the cut one is no failure
    assert overall["cut"] == 1 and overall["env_failed"] == 1
    assert report["tasks"]["miniwob/click-test"]["cut"] == 1
    table = markdown(report)
    assert "| Env failed | Cut |" in table and table.rstrip().endswith("| 1 | 1 |")


def test_the_greedy_check_of_only_env_failed_episodes_is_not_measured_not_a_crash():
    """A probe round whose every episode env-failed (its judge down) scores nothing: NaN (the trainer's
    stop_at_greedy_success reads it as not reached), never a TypeError that ends the run."""
    failed = [_episode(s, 0.0, truncated=True, env_failed=True) for s in range(3)]
    assert math.isnan(greedy_success(failed))
    assert greedy_success(failed + [_episode(3, 1.0, terminated=True), _episode(4, 0.0, truncated=True)]) == 0.5
