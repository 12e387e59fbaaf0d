"""The `web` latency regime: real websites answer in hundreds of milliseconds to seconds with a long tail, while
MiniWoB++ pages served from disk answer at once. A benchmark regime for measuring what asynchronous rollouts buy;
off ("local") by default.

    config = LatencyConfig.from_dict({"regime": "web", "seed": 0})   # a run's env.latency (rollout/spec.py)
    env = LatencyEnv(make_inner_env(), config)                        # what registry.make_env does in "web"
    config.network                                                    # NetworkConditions for Chromium, or None

Two parts:
- a page delay after every `reset` and every `step` (the page "loading"), for every env (the toy too), drawn from a
  lognormal with median `page_delay_median_s` and 95th percentile `page_delay_p95_s`
  (sigma = ln(p95 / median) / 1.645), clipped at `page_delay_max_s`. Episode k of a wrapped env after
  `reset(seed)` draws from `numpy.random.default_rng([config.seed, seed, k])`: the same run plays the same delays.
- Chromium's network conditions (DevTools `Network.emulateNetworkConditions`: round-trip latency, download and
  upload throughput) for browser envs (`Browser.emulate_network`); the defaults are DevTools' "Fast 4G" preset.
  file:// pages (MiniWoB++) load outside the network stack, so for them the page delay is what counts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import numpy as np

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.base import Env, Observation, StepResult

REGIMES = ("local", "web")
Z_95 = 1.6448536269514722   # the standard normal's 95th percentile
STEP_HEADROOM_S = 5.0       # of env.step_timeout_s, left to the page's own work above the largest page delay
# DevTools' "Fast 4G" throttling preset (Chromium's NetworkManager: 9 Mbps x 0.9 down, 1.5 Mbps x 0.9 up,
# 60 ms x 2.75 round trip).
FAST_4G = {"network_latency_ms": 165.0, "download_kbps": 8100.0, "upload_kbps": 1350.0}


@dataclasses.dataclass(frozen=True)
class NetworkConditions:
    """Chromium's emulated network: `latency_ms` added to every request's round trip; throughputs in kbit/s
    (0: not throttled)."""

    latency_ms: float
    download_kbps: float
    upload_kbps: float

    def cdp_params(self) -> dict:
        """The parameters of CDP `Network.emulateNetworkConditions` (throughput in bytes/s, -1: unthrottled)."""
        def rate(kbps: float) -> float:
            return kbps * 1000.0 / 8.0 if kbps > 0 else -1.0

        return {"offline": False, "latency": float(self.latency_ms), "downloadThroughput": rate(self.download_kbps),
                "uploadThroughput": rate(self.upload_kbps)}


@dataclasses.dataclass(frozen=True)
class LatencyConfig:
    """A run's `env.latency` (configs/base.py documents each field). ValueError "field=value: fix" on a bad one.

    regime: "local" (off: envs answer as fast as they can) or "web" (page delays + network conditions).
    page_delay_median_s / page_delay_p95_s / page_delay_max_s: the lognormal page delay and its cap
        (median 0: no page delay; p95 == median: a constant delay).
    network_latency_ms / download_kbps / upload_kbps: Chromium's network conditions (all 0: not emulated).
    seed: the delays' random stream (the run's seed).
    """

    regime: str = "local"
    page_delay_median_s: float = 0.8
    page_delay_p95_s: float = 5.0
    page_delay_max_s: float = 20.0
    network_latency_ms: float = FAST_4G["network_latency_ms"]
    download_kbps: float = FAST_4G["download_kbps"]
    upload_kbps: float = FAST_4G["upload_kbps"]
    seed: int = 0

    def __post_init__(self):
        if self.regime not in REGIMES:
            _bad("regime", self.regime, "use 'local' (off) or 'web' (page delays and Chromium network conditions)")
        for name in ("page_delay_median_s", "page_delay_p95_s", "page_delay_max_s", "network_latency_ms",
                     "download_kbps", "upload_kbps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                _bad(name, value, "must be a finite number >= 0")
        if self.page_delay_p95_s < self.page_delay_median_s:
            _bad("page_delay_p95_s", self.page_delay_p95_s,
                 f"must be >= page_delay_median_s={self.page_delay_median_s!r} (equal: a constant delay)")
        if self.page_delay_max_s <= self.page_delay_p95_s and self.page_delay_median_s > 0:
            _bad("page_delay_max_s", self.page_delay_max_s,
                 f"must be above page_delay_p95_s={self.page_delay_p95_s!r} (the cap clips the tail, not the body)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            _bad("seed", self.seed, "must be an int")

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> "LatencyConfig":
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            _bad(unknown[0], values[unknown[0]], f"not a latency option (known: {', '.join(sorted(known))})")
        return cls(**values)

    @classmethod
    def for_run(cls, values: dict[str, Any] | None, step_timeout_s: float | None) -> "LatencyConfig":
        """A run's env.latency (`from_dict`) checked against its env.step_timeout_s (`check_step_timeout`): the
        one check config validation, the fleet planner and a rollout worker's config each call."""
        config = cls.from_dict(values)
        config.check_step_timeout(step_timeout_s)
        return config

    @property
    def enabled(self) -> bool:
        return self.regime != "local"

    @property
    def sigma(self) -> float:
        """The lognormal's sigma: ln(p95 / median) / z_0.95 (0 for a constant or absent delay)."""
        if self.page_delay_median_s == 0:
            return 0.0
        return math.log(self.page_delay_p95_s / self.page_delay_median_s) / Z_95

    @property
    def network(self) -> NetworkConditions | None:
        """Chromium's network conditions in this regime, or None (regime "local", or all three knobs 0)."""
        if not self.enabled or not (self.network_latency_ms or self.download_kbps or self.upload_kbps):
            return None
        return NetworkConditions(self.network_latency_ms, self.download_kbps, self.upload_kbps)

    def check_step_timeout(self, step_timeout_s: float | None) -> None:
        """ValueError unless the largest page delay leaves STEP_HEADROOM_S of each env call's timeout (the delay
        is part of the call the rollout worker times)."""
        if not self.enabled or step_timeout_s is None or self.page_delay_median_s == 0:
            return
        if self.page_delay_max_s + STEP_HEADROOM_S > step_timeout_s:
            _bad("page_delay_max_s", self.page_delay_max_s,
                 f"a delay this long plus the page's own work ({STEP_HEADROOM_S:g} s) would time out the env call "
                 f"(env.step_timeout_s={step_timeout_s!r}): raise env.step_timeout_s to at least "
                 f"{self.page_delay_max_s + STEP_HEADROOM_S:g} or lower the cap")


def _bad(name: str, value, fix: str) -> None:
    raise ValueError(f"{name}={value!r}: {fix}")


def page_delays(rng: np.random.Generator, config: LatencyConfig, size: int | None = None):
    """Page delays in seconds (float64 [size], or a float when size is None): lognormal(ln median, sigma),
    clipped at `page_delay_max_s`; 0 when the median is 0."""
    if config.page_delay_median_s == 0:
        return 0.0 if size is None else np.zeros(size)
    draws = rng.lognormal(math.log(config.page_delay_median_s), config.sigma, size)
    clipped = np.minimum(draws, config.page_delay_max_s)
    return float(clipped) if size is None else clipped


class LatencyEnv:
    """An env whose `reset` and `step` take a page delay after the inner call (the `Env` interface; any other
    attribute is the inner env's). `sleep` is injectable (tests pass a recorder); `total_delay_s` and `delays`
    count the delays taken."""

    def __init__(self, env: Env, config: LatencyConfig, *, sleep: Callable[[float], None] = time.sleep):
        self.env = env
        self.config = config
        self._sleep = sleep
        self._rng = np.random.default_rng([config.seed % 2**63])   # each reset replaces it (see the module doc)
        self._episodes = 0
        self.total_delay_s = 0.0
        self.delays = 0

    @property
    def task_id(self) -> str:
        return self.env.task_id

    @property
    def max_steps(self) -> int:
        return self.env.max_steps

    def reset(self, seed: int) -> Observation:
        observation = self.env.reset(seed)
        self._rng = np.random.default_rng([self.config.seed % 2**63, int(seed) % 2**63, self._episodes])
        self._episodes += 1
        self._delay()
        return observation

    def step(self, action: Action | str) -> StepResult:
        result = self.env.step(action)
        self._delay()
        return result

    def close(self) -> None:
        self.env.close()

    def _delay(self) -> None:
        seconds = page_delays(self._rng, self.config)
        self.total_delay_s += seconds
        self.delays += 1
        if seconds > 0:
            self._sleep(seconds)

    def __getattr__(self, name: str):   # the inner env's own API (a browser env's `browser`, `run_js`, ...)
        if name == "env":   # not set yet (unpickling, a half-built wrapper): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)
