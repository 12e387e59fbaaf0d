"""The greedy policy's success on fixed held-out instances, measured after every train step
(`train.stop_at_greedy_success`: a run stops once its greedy policy solves them). The seeds are held out, not
always the instances: the toy's instance is `seed % 4`, the four instructions it trains on.

    probe = SuccessProbe(config, policy, num_seeds=4)       # the recipe's tasks x seeds EVAL_SEED_START + 0..3
    rate = probe(params, version)                            # temperature 0, one episode an instance
    probe.close()

It plays through the real rollout path (`evaluate.Players`: a policy server, rollout workers, a scratch ring
buffer) kept up between calls, so its sampler compiles once and its browsers start once; a call costs one greedy
episode per instance (0.15 s for the toy's four). The first round, which compiles (7 s on the toy), is played in the
background as soon as the probe is built, with the policy it was built with, so a training run's start-up (workers
starting, the first update compiling) hides it. Its server holds a second copy of the params: a check for
small runs and tests, not for a paper-scale run (evaluate its checkpoints with launch/eval.py instead).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

from jaxwebrl.buffer.from_config import create_sized
from jaxwebrl.env.registry import run_horizon
from jaxwebrl.eval import report as report_lib
from jaxwebrl.eval.evaluate import Players, eval_config
from jaxwebrl.seeds import EVAL_SEED_START


class SuccessProbe:
    """Greedy success of a policy's params on the recipe's tasks x `num_seeds` held-out instances (see the module
    docstring). Call with (params, version); close when done."""

    def __init__(self, config, policy, *, num_seeds: int, num_workers: int = 1):
        if num_seeds < 1:
            raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
        tasks, config = eval_config(config)
        self.jobs = [(task, seed) for task in tasks for seed in range(EVAL_SEED_START, EVAL_SEED_START + num_seeds)]
        self._scratch = tempfile.mkdtemp(prefix="jaxwebrl-probe-")
        try:
            buffer = create_sized(config, os.path.join(self._scratch, "buffer"), len(self.jobs),
                                  run_horizon(tasks, config.env.max_episode_steps))
            self.players = Players(config, policy, buffer, episodes_per_seed=1, num_workers=num_workers,
                                   temperature=0.0)
        except BaseException:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise
        self._warmup_error: BaseException | None = None
        self._warmup = threading.Thread(target=self._warm_up, name="greedy-check-warmup", daemon=True)
        self._warmup.start()

    def _warm_up(self) -> None:
        try:
            self.players.play(self.jobs)   # compiles the sampler for these prompts; its result is not used
        except BaseException as exc:  # noqa: BLE001 - re-raised by the first call
            self._warmup_error = exc

    def __call__(self, params, version: int) -> float:
        """Success rate in [0, 1] of one greedy episode of every job under `params` (`greedy_success`)."""
        self._warmup.join()
        if self._warmup_error is not None:
            error, self._warmup_error = self._warmup_error, None
            raise error
        self.players.set_weights(params, version)
        return greedy_success(self.players.play(self.jobs))

    def close(self) -> None:
        self._warmup.join()
        try:
            self.players.close()
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)


def greedy_success(episodes) -> float:
    """The success rate of the scored `episodes`; NaN when none was scored (every one env-failed or cut, e.g. its
    judge down): not measured, so a run neither stops on it nor crashes."""
    rate = report_lib.summarize(episodes)["overall"]["success_rate"]
    return float("nan") if rate is None else float(rate)
