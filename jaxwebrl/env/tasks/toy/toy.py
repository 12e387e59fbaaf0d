"""A browser-free toy environment behind the Env interface: trainer tests and learning checks in seconds.

Four instructions, three turns, two actions per turn. Each instruction names one target path of button
presses; the exact terminal verifier gives reward 1.0 only when all three presses match it:

    "Press left, left, right."  -> [0, 0, 1]      "Press left, right, left."   -> [0, 1, 0]
    "Press right, left, right." -> [1, 0, 1]      "Press right, right, left."  -> [1, 1, 0]

Every turn's press depends on both the goal and the turn (no turn and no goal alone predicts it).

Button 0 is the left half of the screen, button 1 the right half: any click with x < 500 presses 0, any
click with x >= 500 presses 1. The short canonical texts are ``click(250, 500)`` and ``click(750, 500)``.
Every step uses up a turn; an invalid or non-click action presses nothing, so the episode cannot succeed.
The screenshot is a small deterministic uint8 picture (both buttons, one progress cell per turn coloured by
the press made there) so the visual path of the policy is exercised.
"""

from __future__ import annotations

import numpy as np

from jaxwebrl.env.agent.actions import COORD_MAX, Action, parse_action
from jaxwebrl.env.base import Observation, StepResult

TARGET_PATHS = ((0, 0, 1), (0, 1, 0), (1, 0, 1), (1, 1, 0))
BUTTON_NAMES = ("left", "right")
# The goal names the presses ("Press left, left, right."): instructions that differ in many tokens. With goals
# that differed in one letter ("... pattern A."), the tiny policy needed ~55 full-batch supervised steps before
# its choices depended on the goal, and RL collapsed onto two of the four tasks first; with these, ~20.
INSTRUCTIONS = tuple("Press " + ", ".join(BUTTON_NAMES[b] for b in path) + "." for path in TARGET_PATHS)
NUM_TURNS = 3
NUM_ACTIONS = 2
ACTION_TEXTS = ("click(250, 500)", "click(750, 500)")  # press button 0, press button 1
NO_PRESS = -1

_BUTTON_COLOURS = np.array([[40, 90, 200], [230, 140, 30]], np.uint8)  # blue (0), orange (1)
_CELL_COLOURS = {NO_PRESS: (200, 40, 40), None: (90, 90, 90)}  # invalid press: red; turn not played: grey


class ToyEnv:
    """The three-turn, two-button toy task (see module docstring).

    reset(seed) picks instruction ``seed % 4``; the instance is fully determined by the seed.
    screenshot_size: (W, H) of the rendered screenshot (the MiniWoB++ env's convention), each at least 16.
    """

    task_id = "toy"

    def __init__(self, screenshot_size: tuple[int, int] = (64, 64), max_steps: int = NUM_TURNS):
        width, height = (int(v) for v in screenshot_size)
        if height < 16 or width < 16:
            raise ValueError(f"ToyEnv screenshot_size must be at least (16, 16), got {screenshot_size}")
        if int(max_steps) != NUM_TURNS:
            raise ValueError(f"ToyEnv has exactly {NUM_TURNS} turns; max_steps={max_steps} is not supported")
        self.screenshot_size = (width, height)
        self.max_steps = NUM_TURNS
        self._instruction: int | None = None
        self._presses: list[int] = []

    @property
    def target_path(self) -> tuple[int, ...]:
        """The path the current instruction asks for (valid after reset)."""
        self._require_reset()
        return TARGET_PATHS[self._instruction]

    def reset(self, seed: int) -> Observation:
        self._instruction = int(seed) % len(INSTRUCTIONS)
        self._presses = []
        return self._observation()

    def step(self, action: Action | str) -> StepResult:
        self._require_reset()
        if len(self._presses) >= NUM_TURNS:
            raise RuntimeError("ToyEnv episode is over; call reset(seed) before stepping again")
        if isinstance(action, str):
            action = parse_action(action)
        press, error = press_of(action)
        self._presses.append(press)
        done = len(self._presses) == NUM_TURNS
        reward = float(verify(self._instruction, self._presses)) if done else 0.0
        info = {"invalid_action": not action.is_valid, "action_error": error, "step": len(self._presses),
                "press": press}
        if done:
            info["success"] = reward == 1.0
        return StepResult(self._observation(), reward, terminated=done, truncated=False, info=info)

    def close(self) -> None:
        self._instruction = None

    def _require_reset(self) -> None:
        if self._instruction is None:
            raise RuntimeError("ToyEnv.reset(seed) must be called first")

    def _observation(self) -> Observation:
        info = {"instruction": self._instruction, "turn": len(self._presses)}
        return Observation(goal=INSTRUCTIONS[self._instruction], screenshot=self._render(), url="toy://",
                           info=info)

    def _render(self) -> np.ndarray:
        """uint8 [H, W, 3]: top quarter = one progress cell per turn; below, button 0 left, button 1 right."""
        width, height = self.screenshot_size
        image = np.full((height, width, 3), 245, np.uint8)
        strip = height // 4
        for turn in range(NUM_TURNS):
            x0, x1 = turn * width // NUM_TURNS + 1, (turn + 1) * width // NUM_TURNS - 1
            press = self._presses[turn] if turn < len(self._presses) else None
            colour = _BUTTON_COLOURS[press] if press in (0, 1) else _CELL_COLOURS[press]
            image[1:strip - 1, x0:x1] = colour
        for button in range(NUM_ACTIONS):
            x0, x1 = button * width // 2 + 2, (button + 1) * width // 2 - 2
            image[strip + 2:height - 2, x0:x1] = _BUTTON_COLOURS[button]
        return image


def press_of(action: Action) -> tuple[int, str | None]:
    """(button pressed, error text): a click presses 0 (x < 500) or 1; anything else presses nothing."""
    if not action.is_valid:
        return NO_PRESS, action.error
    if action.kind != "click":
        return NO_PRESS, f"the toy task only takes clicks on its two buttons, got {action.kind}"
    return (0 if action.x < COORD_MAX // 2 else 1), None


def verify(instruction: int, presses: list[int]) -> bool:
    """The exact terminal verifier: all three presses equal the instruction's target path."""
    return tuple(presses) == TARGET_PATHS[instruction]


def oracle_action_text(goal: str, turn: int) -> str:
    """The correct short action text for a toy goal at a turn (0-based); for scripted policies and tests."""
    try:
        instruction = INSTRUCTIONS.index(goal)
    except ValueError:
        raise ValueError(f"not a toy instruction: {goal!r}") from None
    if not 0 <= turn < NUM_TURNS:
        raise ValueError(f"toy turn must be in 0..{NUM_TURNS - 1}, got {turn}")
    return ACTION_TEXTS[TARGET_PATHS[instruction][turn]]
