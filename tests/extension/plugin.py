"""An extension written outside the package: one loss, one advantage estimator and one task family (a Python
environment with its action texts, horizon and oracle), registered under new names that `tests/extension/config.py` uses (via `config.extensions`, so every process of
the run, rollout workers included, imports this module first). docs/interfaces.md, "Extending", points here.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.env.agent.actions import Action, parse_action
from jaxwebrl.env.base import Observation, StepResult
from jaxwebrl.env.families import TaskFamily, register_family
from jaxwebrl.rl.estimators import register_estimator
from jaxwebrl.rl.losses import register_loss

LEFT, RIGHT = "click(250, 500)", "click(750, 500)"


def capped_pg_loss(logprobs, prox_logprobs, behave_logprobs, advantages, loss_mask, *, ratio_cap=2.0):
    """REINFORCE weighted by the importance ratio to the behaviour policy, capped at `ratio_cap`:
    -mean over policy tokens of min(π/μ, cap)·A. [B, T] in; (loss, stats) out."""
    valid = jnp.asarray(loss_mask).astype(bool)
    gap = jnp.where(valid, jnp.asarray(logprobs, jnp.float32) - jax.lax.stop_gradient(behave_logprobs), 0.0)
    ratio = jnp.exp(gap)
    adv = jax.lax.stop_gradient(jnp.where(valid, jnp.asarray(advantages, jnp.float32), 0.0))
    count = jnp.maximum(valid.sum(), 1).astype(jnp.float32)
    loss = -(jnp.where(valid, jnp.minimum(ratio, ratio_cap) * adv, 0.0)).sum() / count
    capped = (valid & (ratio > ratio_cap)).sum() / count
    return loss, {"loss": jax.lax.stop_gradient(loss), "capped_fraction": capped}


def signed_estimator(episode_rewards, group_index, valid, **_):
    """r̂ = +1 for a success, -1 for a failure (no group baseline): [E] -> [E] float32."""
    del group_index
    return jnp.where(valid, jnp.where(jnp.asarray(episode_rewards) > 0, 1.0, -1.0), 0.0).astype(jnp.float32)


class TwoPressesEnv:
    """Two turns; the goal names one button ("Press left." or "Press right.", by seed parity), reward 1.0 when both
    presses hit it. A click with x < 500 presses left. The screenshot shows both buttons and the presses so far."""

    task_id = "two_presses"
    GOALS = ("Press left.", "Press right.")

    def __init__(self, screenshot_size=(64, 64), max_steps=2):
        self.width, self.height = (int(v) for v in screenshot_size)
        self.max_steps = 2
        self._goal, self._presses = 0, []

    def reset(self, seed: int) -> Observation:
        self._goal, self._presses = int(seed) % 2, []
        return self._observation()

    def step(self, action) -> StepResult:
        action = parse_action(action) if isinstance(action, str) else action
        press = None if action.kind != "click" else int(action.x >= 500)
        self._presses.append(press)
        done = len(self._presses) == self.max_steps
        reward = float(done and all(p == self._goal for p in self._presses))
        info = {"invalid_action": not action.is_valid, "action_error": action.error, "step": len(self._presses)}
        return StepResult(self._observation(), reward, terminated=done, truncated=False, info=info)

    def close(self) -> None:
        pass

    def _observation(self) -> Observation:
        image = np.full((self.height, self.width, 3), 240, np.uint8)
        image[self.height // 2:, : self.width // 2] = (40, 90, 200)
        image[self.height // 2:, self.width // 2:] = (230, 140, 30)
        for turn, press in enumerate(self._presses):
            image[: self.height // 4, turn * self.width // 2:(turn + 1) * self.width // 2] = 90 + 100 * (press or 0)
        return Observation(goal=self.GOALS[self._goal], screenshot=image, url="two-presses://")


register_loss("capped_pg", capped_pg_loss, ratio_cap=2.0)
register_estimator("signed", signed_estimator, reward_norm=(None, None, False))
def press_the_goal(env, observation, step):
    """The oracle: press the button the goal names, every turn."""
    return Action("click", x=250 if observation.goal == TwoPressesEnv.GOALS[0] else 750, y=500)


def make_two_presses(spec, *, screenshot_size=(64, 64), max_steps=None, browser=None, network=None):
    del max_steps, browser, network   # two turns of its own, no browser
    return TwoPressesEnv(screenshot_size=screenshot_size)


def check_two_presses(spec):
    if spec != "two_presses":
        raise ValueError(f"env spec {spec!r}: two_presses takes no options")
    return spec


register_family(TaskFamily(
    name="two_presses", claims=lambda spec: isinstance(spec, str) and spec.partition("?")[0] == "two_presses",
    check=check_two_presses, make=make_two_presses, horizon=lambda spec, cap: 2,
    action_texts=lambda spec: (LEFT, RIGHT), needs_browser=False, oracle=lambda spec: press_the_goal,
    doctor_specs=lambda: ["two_presses"]))
