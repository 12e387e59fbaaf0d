"""A test extension: the env "hangs_in_step" writes $JAXWEBRL_TEST_HANG_MARKER at its first step, then hangs in it
(as a wedged browser call would), so a worker told to stop finds its env thread busy for step_timeout_s; the env
"hangs_in_close" plays and hangs when it is closed (as a browser that will not quit)."""

import os
import time

import numpy as np

from jaxwebrl.env.base import Observation
from jaxwebrl.env.registry import register_env


class HangsInStepEnv:
    task_id = "hangs_in_step"

    def __init__(self, screenshot_size=(64, 64), max_steps=2):
        self.size, self.max_steps = tuple(int(v) for v in screenshot_size), 2

    def reset(self, seed: int) -> Observation:
        return Observation(goal="Wait.", screenshot=np.zeros((*self.size[::-1], 3), np.uint8), url="hang://")

    def step(self, action):
        with open(os.environ["JAXWEBRL_TEST_HANG_MARKER"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)

    def close(self) -> None:
        pass


class HangsInCloseEnv(HangsInStepEnv):
    task_id = "hangs_in_close"

    def step(self, action):
        raise AssertionError("not reached: the policy server refuses the worker first")

    def close(self) -> None:
        time.sleep(3600)


register_env("hangs_in_step", HangsInStepEnv, action_texts=("click(500, 500)",), takes_max_steps=False)
register_env("hangs_in_close", HangsInCloseEnv, action_texts=("click(500, 500)",), takes_max_steps=False)
