"""The chain family's oracle: it reads only what the agent has.

The goal, the screenshot it saw (the variant's progress strip, the buttons' colours) and, in the recall variant,
how many presses it made; it presses the goal's next colour.
"""

from __future__ import annotations

import re

import numpy as np

from jaxwebrl.env.agent.actions import Action
from jaxwebrl.env.tasks.chain import chain_tasks
from jaxwebrl.env.tasks.episode import OracleError

_PALETTE = {**chain_tasks.COLOUR_RGB, "done": chain_tasks.DONE_RGB, "todo": chain_tasks.TODO_RGB,
            "page": (244, 244, 244)}


def _colour_at(shot: np.ndarray, point: tuple[int, int]) -> str:
    """The palette name nearest the screenshot's pixel at a 0..1000 point (any screenshot size)."""
    height, width = shot.shape[:2]
    x = min(int(point[0] / 1000 * width), width - 1)
    y = min(int(point[1] / 1000 * height), height - 1)
    pixel = shot[y, x].astype(int)
    return min(_PALETTE, key=lambda name: int(((pixel - np.array(_PALETTE[name])) ** 2).sum()))


def chain_oracle(env) -> Action:
    """Press the goal's next colour: how far it got comes from the progress strip (plain), the strip's cue cell
    names the colour itself (cue), or its own count of presses, all correct (recall)."""
    spec, shot = env.spec, env.last_screenshot
    names = re.findall(r"[a-z]+", env.goal.removeprefix("Press "))
    if shot is None or not names or any(n not in chain_tasks.COLOURS for n in names):
        raise OracleError(f"{env.task_id}: no screenshot yet or a goal {env.goal!r} that names no colours")
    cells = [_colour_at(shot, ((x0 + x1) // 2, (y0 + y1) // 2))
             for x0, y0, x1, y1 in chain_tasks.strip_cells(spec.presses)]
    if spec.variant == "cue":
        wanted = next((c for c in cells if c in chain_tasks.COLOURS), None)
    else:
        progress = env.steps_taken if spec.variant == "recall" else cells.count("done")
        wanted = names[progress] if progress < len(names) else None
    slots = [_colour_at(shot, chain_tasks.slot_centre(s)) for s in range(len(chain_tasks.SLOTS))]
    if wanted not in slots:
        raise OracleError(f"{env.task_id}: the colour to press ({wanted}) is not on the page ({slots})")
    x, y = chain_tasks.slot_centre(slots.index(wanted))
    return Action("click", x=x, y=y)
