"""The MiniWoB++ tasks bundled in the installed `miniwob` package, and their difficulty splits (no browser needed).

    available_tasks()            # every task name with an html/miniwob/<task>.html page
    task_split("click-test")     # "easy" | "medium" | "hard" | None
    horizon("book-flight")       # the split's step horizon (DEFAULT_HORIZON outside the splits)
    click_grid("choose-date")    # (columns, rows) of the task's declared click grid, None: the default 10 x 10
    miniwob_options("reward=strict")   # a spec's options: "miniwob/click-checkboxes-large?reward=strict"

Rewards (`reward=` in a spec): "binary" (default) is MiniWoB++'s own success, raw > 0, so the checkbox tasks
(raw = (right - wrong boxes) / boxes) count a partial answer as a win; "strict" wins only on raw == 1 (every box
right, the exact date); "raw" passes the page's value in [-1, 1] through.

Config validation, the env registry and the evaluation report read these without importing Selenium;
`jaxwebrl.env.tasks.miniwob.MiniWobEnv` plays the tasks in Chromium.
"""

from __future__ import annotations

import os

# Difficulty splits by how many actions a competent policy needs, each with its step horizon.
SPLITS: dict[str, tuple[int, tuple[str, ...]]] = {
    "easy": (5, (
        "click-test", "click-test-2", "click-button", "click-link", "click-dialog", "click-dialog-2",
        "click-tab", "focus-text", "focus-text-2", "click-widget", "click-color", "identify-shape",
    )),
    "medium": (10, (
        "click-option", "click-checkboxes", "enter-text", "enter-text-2", "enter-password", "login-user",
        "click-button-sequence", "click-collapsible", "click-tab-2", "choose-list", "enter-date",
        "use-spinner", "navigate-tree", "guess-number",
    )),
    "hard": (20, (
        "click-checkboxes-large", "click-scroll-list", "email-inbox", "book-flight", "search-engine",
        "social-media", "login-user-popup", "choose-date", "click-pie", "use-autocomplete",
    )),
}
DEFAULT_HORIZON = 10
REWARDS = ("binary", "strict", "raw")
# Tasks whose targets the default 10 x 10 grid cannot all hit: click-checkboxes-large's rows are 11 px tall on a
# 19 px pitch (the 21 px grid rows skip most of them), choose-date's "Prev" and day cells are 13 x 13 and
# 15 x 12 px. A 20 x 20 grid (8 x 10.5 px pitch) hits each of them.
CLICK_GRIDS: dict[str, tuple[int, int]] = {"click-checkboxes-large": (20, 20), "choose-date": (20, 20)}


def html_dir() -> str:
    """The `html` directory of the installed miniwob package (holds core/, common/ and miniwob/<task>.html)."""
    try:
        import miniwob  # deferred: only where task pages are read (a clear error when the package is missing)
    except ImportError:
        raise ImportError("the miniwob package is missing: pip install miniwob") from None
    return os.path.join(os.path.dirname(miniwob.__file__), "html")


def available_tasks() -> list[str]:
    folder = os.path.join(html_dir(), "miniwob")
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".html"))


def task_split(task: str) -> str | None:
    for split, (_, tasks) in SPLITS.items():
        if task in tasks:
            return split
    return None


def split_tasks(split: str) -> tuple[str, ...]:
    if split not in SPLITS:
        raise ValueError(f"unknown MiniWoB++ split {split!r}: use one of {list(SPLITS)}")
    return SPLITS[split][1]


def horizon(task: str) -> int:
    split = task_split(task)
    return SPLITS[split][0] if split else DEFAULT_HORIZON


def click_grid(task: str) -> tuple[int, int] | None:
    """(columns, rows) of the click grid a task declares (CLICK_GRIDS), or None for the default grid."""
    return CLICK_GRIDS.get(task)


def miniwob_options(query: str) -> dict:
    """The options after "?" in a MiniWoB++ spec ("reward=strict") as MiniWobEnv keywords; ValueError naming the
    problem and the fix."""
    options: dict = {}
    for pair in (p for p in query.split("&") if p) if query else ():
        key, _, value = pair.partition("=")
        if key != "reward" or value not in REWARDS:
            raise ValueError(f"MiniWoB++ spec option {pair!r}: use reward={' | '.join(REWARDS)}")
        options[key] = value
    return options
