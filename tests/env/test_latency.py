"""The "web" latency regime (jaxwebrl/env/latency.py): the lognormal page delay's median and tail, the wrapper's
delays around a real toy env (an injected sleep, no wall-clock asserts), the run config's path to it through the
worker spec, and Chromium's emulated network conditions in a real browser."""

import math
import time

import numpy as np
import pytest

from configs import base
from jaxwebrl.env.tasks.toy import toy
from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.latency import FAST_4G, LatencyConfig, LatencyEnv, NetworkConditions, page_delays
from jaxwebrl.env.browser.probes import serve_directory
from jaxwebrl.env.registry import make_env
from jaxwebrl.rollout.spec import worker_fields
from jaxwebrl.rollout.worker import WorkerConfig

WEB = LatencyConfig(regime="web", seed=7)


def test_page_delays_have_the_configured_median_and_p95():
    draws = page_delays(np.random.default_rng(0), WEB, 200_000)
    assert draws.shape == (200_000,) and draws.dtype == np.float64
    assert np.median(draws) == pytest.approx(0.8, rel=0.02)
    assert np.percentile(draws, 95) == pytest.approx(5.0, rel=0.03)
    assert WEB.sigma == pytest.approx(math.log(5.0 / 0.8) / 1.6449, rel=1e-4)
    # the cap clips the far tail only: P(X > 20 s) = P(Z > ln(25) / sigma) ~ 0.2 %
    assert draws.max() == 20.0 and 0.0005 < np.mean(draws == 20.0) < 0.005
    assert draws.min() > 0.0


def test_constant_and_absent_page_delays():
    constant = LatencyConfig(regime="web", page_delay_median_s=0.3, page_delay_p95_s=0.3)
    assert constant.sigma == 0.0
    assert np.all(page_delays(np.random.default_rng(1), constant, 100) == pytest.approx(0.3))
    none = LatencyConfig(regime="web", page_delay_median_s=0.0, page_delay_p95_s=0.0)
    assert page_delays(np.random.default_rng(1), none) == 0.0


@pytest.mark.parametrize("options, message", [
    ({"regime": "remote"}, r"^regime='remote': use 'local' \(off\) or 'web'"),
    ({"page_delay_median_s": -0.1}, r"^page_delay_median_s=-0\.1: must be a finite number >= 0"),
    ({"upload_kbps": float("nan")}, r"^upload_kbps=nan: must be a finite number >= 0"),
    ({"page_delay_p95_s": 0.5}, r"^page_delay_p95_s=0\.5: must be >= page_delay_median_s=0\.8"),
    ({"page_delay_max_s": 5.0}, r"^page_delay_max_s=5\.0: must be above page_delay_p95_s=5\.0"),
    ({"jitter": 1.0}, r"^jitter=1\.0: not a latency option \(known: download_kbps, "),
])
def test_bad_latency_options_fail_naming_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        LatencyConfig.from_dict(options)


def test_network_conditions_in_the_web_regime_only():
    assert LatencyConfig().network is None and not LatencyConfig().enabled
    assert WEB.network == NetworkConditions(FAST_4G["network_latency_ms"], FAST_4G["download_kbps"],
                                            FAST_4G["upload_kbps"])
    assert WEB.network.cdp_params() == {"offline": False, "latency": 165.0, "downloadThroughput": 8100 * 125.0,
                                        "uploadThroughput": 1350 * 125.0}
    latency_only = NetworkConditions(400, 0, 0).cdp_params()
    assert latency_only["downloadThroughput"] == latency_only["uploadThroughput"] == -1.0   # not throttled
    assert LatencyConfig(regime="web", network_latency_ms=0, download_kbps=0, upload_kbps=0).network is None


class FakeClock:
    """`sleep` for LatencyEnv: advances a clock instead of waiting, and records every delay."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def play_toy(env, seed):
    """One whole toy episode with the oracle's presses: (rewards, goals)."""
    obs = env.reset(seed)
    rewards = []
    for turn in range(toy.NUM_TURNS):
        result = env.step(toy.oracle_action_text(obs.goal, turn))
        rewards.append(result.reward)
        obs = result.observation
    return rewards, obs.goal


def test_the_wrapper_delays_every_reset_and_step_of_the_toy():
    clock = FakeClock()
    env = LatencyEnv(toy.ToyEnv(), WEB, sleep=clock.sleep)
    assert env.task_id == "toy" and env.max_steps == toy.NUM_TURNS
    rewards, goal = play_toy(env, seed=5)
    assert rewards == play_toy(toy.ToyEnv(), seed=5)[0] == [0.0, 0.0, 1.0]   # the task itself is unchanged
    assert env.target_path == toy.TARGET_PATHS[5 % 4]                           # the inner env's own API
    assert len(clock.sleeps) == 1 + toy.NUM_TURNS and all(0 < s <= 20.0 for s in clock.sleeps)
    assert clock.now == pytest.approx(sum(clock.sleeps)) == pytest.approx(env.total_delay_s)
    assert env.delays == 4
    # episode 0 after reset(5) draws from default_rng([seed, 5, 0]): the same delays in every run
    assert clock.sleeps == list(page_delays(np.random.default_rng([7, 5, 0]), WEB, 4))

    again = FakeClock()
    play_toy(LatencyEnv(toy.ToyEnv(), WEB, sleep=again.sleep), seed=5)
    assert again.sleeps == clock.sleeps                       # reproducible
    play_toy(env, seed=5)                                     # the group's next episode: other delays
    assert clock.sleeps[4:] != clock.sleeps[:4]
    other_run = FakeClock()
    play_toy(LatencyEnv(toy.ToyEnv(), LatencyConfig(regime="web", seed=8), sleep=other_run.sleep), seed=5)
    assert other_run.sleeps != clock.sleeps                   # another run seed: other delays


def test_the_default_sleep_really_waits():
    """time.sleep waits at least as long as asked: a lower bound, never an upper one."""
    constant = LatencyConfig(regime="web", page_delay_median_s=0.05, page_delay_p95_s=0.05)
    env = LatencyEnv(toy.ToyEnv(), constant)
    start = time.monotonic()
    env.reset(0)
    env.step(toy.ACTION_TEXTS[0])
    assert time.monotonic() - start >= 0.1


def test_a_run_config_turns_the_regime_on_through_the_worker_spec():
    c = base.config()
    base.SCALES["toy"](c)
    local = worker_fields(c)
    assert "latency" not in local["env_options"]              # off by default: the spec is what it was
    assert not isinstance(make_env("toy", **local["env_options"]), LatencyEnv)

    c.env.latency.regime = "web"
    c.seed = 3
    fields = worker_fields(c)
    assert fields["env_options"]["latency"] == {**c.env.latency.to_dict(), "seed": 3}
    WorkerConfig.from_dict(fields)                            # what a worker process accepts
    env = make_env("toy", **fields["env_options"])
    assert isinstance(env, LatencyEnv) and env.config == LatencyConfig(regime="web", seed=3)
    with pytest.raises(ValueError, match=r"^WorkerConfig\.env_options\['latency'\]: page_delay_max_s=20\.0: "):
        WorkerConfig.from_dict(dict(fields, step_timeout_s=10.0))


FETCH_MS = """const done = arguments[arguments.length - 1], start = performance.now();
fetch(arguments[0] + '?' + Math.random()).then(r => r.text()).then(() => done(performance.now() - start));"""
START_PAGE = "<!doctype html><html><body style='margin:0'><p id='p'>hello</p></body></html>"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("latency_site")
    (root / "index.html").write_text(START_PAGE)
    (root / "data.txt").write_text("x" * 20_000)
    server, url, _ = serve_directory(str(root))
    yield url
    server.shutdown()
    server.server_close()


@pytest.mark.browser
def test_chromium_gets_the_network_conditions_and_keeps_them_across_a_restart(site):
    latency = {"regime": "web", "network_latency_ms": 400.0, "download_kbps": 0.0, "upload_kbps": 0.0,
               "page_delay_median_s": 0.0, "page_delay_p95_s": 0.0}
    spec = {"task_id": "latency/fetch", "start_url": f"{site}/index.html", "goal": "Read the page.",
            "max_steps": 3, "evaluator": {"type": "text_match", "text": "never there"}, "viewport": [320, 240]}
    env = make_env(spec, latency=latency)
    try:
        assert isinstance(env, LatencyEnv)
        env.reset(0)
        browser = env.browser
        assert browser.network == NetworkConditions(400.0, 0.0, 0.0)
        # Chromium's throttle adds the latency to every request: an inequality the emulation guarantees
        fetches = [browser.driver.execute_async_script(FETCH_MS, f"{site}/data.txt") for _ in range(2)]
        assert min(fetches) >= 400.0, fetches
        browser.restart()                                  # what the env's next reset does after a crash
        env.reset(1)
        assert min(browser.driver.execute_async_script(FETCH_MS, f"{site}/data.txt") for _ in range(2)) >= 400.0
        browser.emulate_network(None)                      # back to the real network: the same fetch, faster
        plain = min(browser.driver.execute_async_script(FETCH_MS, f"{site}/data.txt") for _ in range(3))
        assert plain < min(fetches), (plain, fetches)
    finally:
        env.close()


@pytest.mark.browser
def test_a_throttled_download_is_slower_than_its_size_allows(site):
    """download_kbps=160: 20 kB (160 kbit) cannot arrive in under a second."""
    latency = {"regime": "web", "network_latency_ms": 0.0, "download_kbps": 160.0, "upload_kbps": 0.0,
               "page_delay_median_s": 0.0, "page_delay_p95_s": 0.0}
    env = make_env("miniwob/click-test", latency=latency)
    try:
        env.reset(0)   # a file:// page: outside the network stack, it loads unthrottled
        assert env.browser.network == NetworkConditions(0.0, 160.0, 0.0)
        env.browser.set_allowlist(UrlAllowlist([f"{site}/*"]))
        env.browser.navigate(f"{site}/index.html")
        assert env.browser.driver.execute_async_script(FETCH_MS, f"{site}/data.txt") >= 1000.0
    finally:
        env.close()
