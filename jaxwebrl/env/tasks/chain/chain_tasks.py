"""The `chain` task family without a browser: its specs, instances (goal, per-page layouts) and rules.

A chain episode asks for a sequence of presses on large coloured buttons ("Press red, blue, green."). Every step
shows a new page: the four colour buttons (and `trap` trap buttons) shuffled over six slots, drawn from the seed
and the page number. A correct press advances, a wrong colour steps back one press, the "back to start" link
resets the progress to 0 (a loop), a trap ends the episode as a failure, a click elsewhere changes nothing.

    spec = parse_chain_spec("chain/hard-recall?trap=1")    # ChainSpec(split="hard", variant="recall", traps=1, ...)
    episode = ChainEpisode(spec, seed=3)                   # episode.goal, episode.layout(), episode.press(slot)

Specs: "chain/<split>[-<variant>][?trap=N&horizon=N&layout=fixed]":

    split    presses (the oracle's success length)   horizon
    easy     3                                        10
    medium   5                                        20
    hard     7                                        30

    variant  the page's progress strip
    (none)   one dark cell per press made
    cue      the same, and the next cell in the colour to press
    recall   nothing: the agent must remember how far it got

    layout   where the buttons are
    shuffled (default) drawn per seed and page: the agent finds each colour on the screenshot
    fixed    red, green, blue, yellow in the top row and the first bottom slot, traps after them, on every
             page: the agent maps colour names to places (the tiny CPU policy cannot bind colours to shuffled
             places: 0% held out after a 400-step warm start, so the CPU regime uses this one)

Held-out instances: a goal sequence is held out when `held_out_sequence` says so (about a quarter of them);
seeds in [EVAL_SEED_START, EVAL_SEED_END) (the evaluation window of `jaxwebrl.seeds`) draw only held-out goals,
every other seed only the others, so evaluation plays goals that training never shows.
Geometry is in the 0..1000 action coordinates over the 160 x 160 page; every slot centre is a click-grid point.
"""

from __future__ import annotations

import dataclasses
import urllib.parse

import numpy as np

from jaxwebrl.seeds import EVAL_SEED_END, EVAL_SEED_START

PREFIX = "chain/"
COLOURS = ("red", "green", "blue", "yellow")
COLOUR_RGB = {"red": (220, 40, 40), "green": (30, 170, 60), "blue": (40, 80, 220), "yellow": (240, 200, 20),
              "trap": (20, 20, 20)}
DONE_RGB = (60, 60, 60)      # a progress cell of a press made
TODO_RGB = (215, 215, 215)   # a progress cell still to do
SPLITS = {"easy": (3, 10), "medium": (5, 20), "hard": (7, 30)}   # split -> (presses to succeed, horizon)
VARIANTS = ("", "cue", "recall")
LAYOUTS = ("shuffled", "fixed")
MAX_TRAPS = 2                # six slots: four colours and at most two traps
MAX_HORIZON = 1000

# Six slots (x0, y0, x1, y1) in 0..1000 units, centres (150|450|750, 250|650) on the 10 x 10 click grid.
SLOTS = tuple((cx - 130, cy - 140, cx + 130, cy + 140) for cy in (250, 650) for cx in (150, 450, 750))
STRIP = (20, 20, 980, 90)    # the progress strip (x0, y0, x1, y1)
BACK_LINK = (20, 890, 380, 1000)   # "back to start"; its centre row 950 holds grid points (50..350, 950)
PAGE_SIZE = (160, 160)       # CSS px of the task area
_LAYOUT_STREAM = 7           # the layouts' random stream: default_rng([seed, _LAYOUT_STREAM, page])


def slot_centre(slot: int) -> tuple[int, int]:
    x0, y0, x1, y1 = SLOTS[slot]
    return (x0 + x1) // 2, (y0 + y1) // 2


def strip_cells(presses: int) -> list[tuple[int, int, int, int]]:
    """The progress strip's cells (x0, y0, x1, y1), one per press."""
    x0, y0, x1, y1 = STRIP
    width = (x1 - x0) / presses
    return [(int(x0 + i * width + 4), y0, int(x0 + (i + 1) * width - 4), y1) for i in range(presses)]


@dataclasses.dataclass(frozen=True)
class ChainSpec:
    """One chain env spec. difficulty: the split the evaluation report files it under."""

    name: str
    split: str
    variant: str
    presses: int
    horizon: int
    traps: int
    layout: str = "shuffled"

    @property
    def difficulty(self) -> str:
        return self.split


def chain_names() -> list[str]:
    """Every registered chain spec without options: chain/easy, chain/easy-cue, chain/easy-recall, ..."""
    return [PREFIX + split + (f"-{variant}" if variant else "") for split in SPLITS for variant in VARIANTS]


def parse_chain_spec(text: str) -> ChainSpec:
    """The ChainSpec of "chain/<split>[-<variant>][?trap=N&horizon=N]"; ValueError naming the problem and fix."""
    name, _, query = str(text).strip().partition("?")
    return chain_spec(name, **chain_options(query, name))


def chain_options(query: str, name: str = "chain/...") -> dict:
    """The options of a spec's query text ("trap=1&horizon=40&layout=fixed") as {"trap": int, "horizon": int,
    "layout": str} (those given)."""
    options: dict = {}
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError:
        raise ValueError(f"chain spec {name}?{query}: options must look like trap=1&horizon=40") from None
    for key, value in pairs:
        if key not in ("trap", "horizon", "layout"):
            raise ValueError(f"chain spec {name}?{query}: unknown option {key!r}: use trap=0..{MAX_TRAPS}, "
                             f"horizon=N or layout={'|'.join(LAYOUTS)}")
        if key == "layout":
            if value not in LAYOUTS:
                raise ValueError(f"chain spec {name}?{query}: layout={value!r}: use one of {', '.join(LAYOUTS)}")
            options[key] = value
            continue
        if not value.isdigit():
            raise ValueError(f"chain spec {name}?{query}: {key}={value!r} must be a non-negative integer")
        options[key] = int(value)
    return options


def chain_spec(name: str, trap: int = 0, horizon: int | None = None, layout: str = "shuffled") -> ChainSpec:
    """The ChainSpec of a registered chain name and its options (ValueError naming the problem and the fix); its
    `name` is the canonical spec text, options that differ from the defaults included ("chain/hard?trap=1")."""
    if name not in chain_names():
        raise ValueError(f"unknown chain spec {name!r}: use one of {', '.join(chain_names())}, optionally with "
                         f"?trap=0..{MAX_TRAPS}&horizon=N")
    split, _, variant = name[len(PREFIX):].partition("-")
    presses, default_horizon = SPLITS[split]
    horizon = default_horizon if horizon is None else int(horizon)
    if not 0 <= int(trap) <= MAX_TRAPS:
        raise ValueError(f"chain spec {name}: trap={trap}: use 0..{MAX_TRAPS} trap buttons a page")
    if not presses <= horizon <= MAX_HORIZON:
        raise ValueError(f"chain spec {name}: horizon={horizon}: must be in {presses}..{MAX_HORIZON} "
                         f"(at least the {presses} presses a success needs)")
    if layout not in LAYOUTS:
        raise ValueError(f"chain spec {name}: layout={layout!r}: use one of {', '.join(LAYOUTS)}")
    extra = {key: value for key, value, default in (("trap", int(trap), 0), ("horizon", horizon, default_horizon),
                                                    ("layout", layout, "shuffled"))
             if value != default}
    full = name + ("?" + urllib.parse.urlencode(extra) if extra else "")
    return ChainSpec(full, split, variant, presses, horizon, int(trap), layout)


def held_out_sequence(sequence) -> bool:
    """Whether a goal sequence (colour indices) is reserved for evaluation (about one in four)."""
    return sum((i + 1) * int(c) for i, c in enumerate(sequence)) % 4 == 0


def is_held_out_seed(seed: int) -> bool:
    return EVAL_SEED_START <= int(seed) < EVAL_SEED_END


def goal_sequence(presses: int, seed: int) -> tuple[int, ...]:
    """The seed's goal (colour indices, no colour twice in a row): held out iff the seed is (see module doc)."""
    rng = np.random.default_rng([int(seed), presses])
    want = is_held_out_seed(seed)
    while True:
        sequence = [int(rng.integers(len(COLOURS)))]
        while len(sequence) < presses:
            sequence.append(int((sequence[-1] + 1 + rng.integers(len(COLOURS) - 1)) % len(COLOURS)))
        if held_out_sequence(sequence) == want:
            return tuple(sequence)


class ChainEpisode:
    """One episode's state: goal, progress, the page number; `press` applies one step's outcome."""

    def __init__(self, spec: ChainSpec, seed: int):
        self.spec, self.seed = spec, int(seed)
        self.sequence = goal_sequence(spec.presses, seed)
        self.goal = "Press " + ", ".join(COLOURS[c] for c in self.sequence) + "."
        self.progress = 0
        self.page = 0
        self.over = False

    def layout(self) -> tuple[str | None, ...]:
        """What each of the six slots holds on the current page: a colour, "trap" or None."""
        order = (np.arange(len(SLOTS)) if self.spec.layout == "fixed" else
                 np.random.default_rng([self.seed, _LAYOUT_STREAM, self.page]).permutation(len(SLOTS)))
        content: list[str | None] = [None] * len(SLOTS)
        for item, slot in zip(list(COLOURS) + ["trap"] * self.spec.traps, order):
            content[int(slot)] = item
        return tuple(content)

    def strip(self) -> list[tuple[int, int, int]]:
        """The progress cells' colours as the variant shows them (recall: all TODO_RGB, i.e. no information)."""
        cells = [TODO_RGB] * self.spec.presses
        if self.spec.variant != "recall":
            cells[:self.progress] = [DONE_RGB] * self.progress
            if self.spec.variant == "cue" and self.progress < self.spec.presses:
                cells[self.progress] = COLOUR_RGB[COLOURS[self.sequence[self.progress]]]
        return cells

    def press(self, target) -> str:
        """Apply what the step's click hit (a slot index, "back" or None) and turn the page; returns the event:
        "advance", "wrong", "back", "trap", "miss" or "success"."""
        item = self.layout()[target] if isinstance(target, int) and 0 <= target < len(SLOTS) else target
        if item == "trap":
            event, self.over = "trap", True
        elif item == "back":
            event, self.progress = "back", 0
        elif item in COLOURS:
            if COLOURS.index(item) == self.sequence[self.progress]:
                event, self.progress = "advance", self.progress + 1
            else:
                event, self.progress = "wrong", max(0, self.progress - 1)
        else:
            event = "miss"
        if self.progress == self.spec.presses:
            event, self.over = "success", True
        self.page += 1
        return event
