"""What a training run says on stderr: start-up phases as they happen and one line per train step, readable in a
file (nohup, SLURM) as on a terminal.

    log_to_stderr()                                   # jaxwebrl's INFO lines on stderr, once per process
    with phase("building the policy"): ...            # "building the policy ..." then "... done in 3.1s"; while it
                                                      #   runs, "... still running (30s)" every HEARTBEAT_S
    step_line(step, total, scalars, step_s, eta_s)    # "step 3/200 reward 0.250 success 0.25 loss ... ETA 4m10s"

No silence longer than HEARTBEAT_S: a phase that blocks (a compilation, a checkpoint restore) logs a heartbeat
from a timer thread, and the trainer logs "waiting for episodes: N/M" while it waits (`trainer.py`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time

log = logging.getLogger("jaxwebrl.run")

HEARTBEAT_S = 20.0   # at most this long without a line while the run starts or waits
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """A handler that writes to the current `sys.stderr` (rich's progress bar redirects it to print above the bar)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):   # logging.StreamHandler assigns it; the current sys.stderr is always used
        del value


def log_to_stderr() -> None:
    """jaxwebrl's INFO logs on stderr (absl may own the root logger, so configure our package logger)."""
    package = logging.getLogger("jaxwebrl")
    package.setLevel(logging.INFO)
    if not package.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        package.addHandler(handler)
        package.propagate = False


@contextlib.contextmanager
def phase(what: str, heartbeat_s: float = HEARTBEAT_S):
    """Log `what ...` now, `what: still running (Ns)` every `heartbeat_s` while the block runs, and
    `what: done in Xs` when it ends (nothing more when it raises: the error says what happened)."""
    start = time.monotonic()
    done = threading.Event()
    log.info("%s ...", what)

    def beat():
        while not done.wait(heartbeat_s):
            log.info("%s: still running (%s)", what, duration(time.monotonic() - start))

    thread = threading.Thread(target=beat, name="console-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    log.info("%s: done in %s", what, duration(time.monotonic() - start))


def duration(seconds: float) -> str:
    """`8.2s`, `4m10s`, `2h05m`, or `?` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def step_line(step: int, total: int, scalars: dict, step_s: float, eta_s: float) -> str:
    """One train step in one line: step, reward, success (and the greedy check's, when the run has one), loss, KLs,
    staleness, trajectories/hour, step time, ETA."""
    def get(key: str) -> float:
        value = scalars.get(key)
        return float("nan") if value is None else float(value)

    greedy = f"greedy {get('eval/greedy_success'):.2f} " if "eval/greedy_success" in scalars else ""
    return (f"step {step}/{total} reward {get('rollout/reward'):.3f} success {get('rollout/success_rate'):.2f} "
            f"{greedy}"
            f"loss {get('ppo_actor/update/actor_loss/avg'):+.4f} kl {get('ppo_actor/update/approx_kl_abs/avg'):.4f} "
            f"behave_kl {get('ppo_actor/update/behave_approx_kl_abs/avg'):.4f} "
            f"staleness {get('rollout/staleness/mean'):.2f} (max {get('rollout/staleness/max'):.0f}) "
            f"traj/h {get('throughput/trajectories_per_hour'):.0f} step_time {duration(step_s)} "
            f"ETA {duration(eta_s)}")


class StepClock:
    """Wall time per train step and the ETA to `total` steps (mean of the last `window` steps; the first step of a
    process, which compiles, counts only until others are there)."""

    def __init__(self, total: int, window: int = 10):
        self.total, self.window = total, window
        self._last = time.monotonic()
        self._times: list[float] = []

    def tick(self, step: int) -> tuple[float, float]:
        """(this step's seconds, seconds left to `total`) at the end of train step `step`."""
        now = time.monotonic()
        step_s, self._last = now - self._last, now
        self._times.append(step_s)
        recent = self._times[1:][-self.window:] or self._times
        return step_s, max(self.total - step, 0) * sum(recent) / len(recent)
