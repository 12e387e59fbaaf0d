"""Repeated warnings at most once per period per kind, the next one counting those held back."""

import logging

from jaxwebrl.rollout import rate_limited_log
from jaxwebrl.rollout.rate_limited_log import RateLimitedLog


def test_one_warning_per_period_per_kind_and_the_next_counts_the_rest(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(rate_limited_log.time, "monotonic", lambda: now[0])
    logger = logging.getLogger("tests.rate_limited")
    warn = RateLimitedLog(logger, period_s=30.0)
    with caplog.at_level(logging.WARNING, logger="tests.rate_limited"):
        for i in range(5):
            warn.warning("cut", "episode %d cut", i)
            now[0] += 1.0
        warn.warning("env", "env failed")             # another kind has its own period
        now[0] += 30.0
        warn.warning("cut", "episode %d cut", 9)
    assert [r.getMessage() for r in caplog.records] == [
        "episode 0 cut", "env failed", "episode 9 cut (4 more like it in the last 30 s)"]
