"""An agent `Action` -> the browser calls that carry it out (clicks, typing, keys, scrolls, waits, navigation).

    info = perform(browser, action, area=(x, y, w, h))   # {"navigation_blocked": url or None, "action_error": ...}

Action coordinates are 0..1000 over `area` (the task area in CSS pixels). After an input action the page settles;
then the popup and allowlist policy (navigation.py) runs, and a refused URL becomes the action's error text, fed
back to the agent. A refusal is task-level (never an exception); a broken browser raises EnvFailure.
"""

from __future__ import annotations

import time

from jaxwebrl.env.agent.actions import Action, to_viewport
from jaxwebrl.env.browser.allowlist import blocked_message
from jaxwebrl.env.browser.navigation import NavigationBlocked, PageNotLoaded


def perform(browser, action: Action, area: tuple[int, int, int, int], check_url: bool = True) -> dict:
    """Execute a valid non-answer action whose 0..1000 coordinates refer to `area` = (x, y, w, h) CSS px.

    Returns info: `navigation_blocked` (refused URL or None) and `action_error` (a task-level refusal such
    as an unknown key or a navigate outside the allowlist, fed back to the agent) or None.
    check_url=False skips the page-URL check (the caller then runs `enforce_allowlist(url)` itself, e.g. with
    a URL it read in the same JavaScript call as the task state).
    """
    ax, ay, aw, ah = area

    def point() -> tuple[float, float]:
        px, py = to_viewport(action.x, action.y, aw, ah)
        return ax + px, ay + py

    error = None
    kind = action.kind
    if kind == "click":
        browser.click(*point(), clicks=action.clicks)
    elif kind == "type":
        if action.has_point:
            browser.click(*point())
        browser.type_text(action.text or "")
    elif kind == "key":
        try:
            browser.press_keys(action.keys or ())
        except ValueError as exc:
            error = str(exc)
    elif kind == "scroll":
        x, y = point() if action.has_point else (ax + aw / 2, ay + ah / 2)
        amount = float(action.amount or 0)
        dx = {"left": -amount, "right": amount}.get(action.direction, 0.0)
        dy = {"up": -amount, "down": amount}.get(action.direction, 0.0)
        browser.scroll(x, y, dx, dy)
    elif kind == "wait":
        seconds = float(action.seconds or 0.0)
        time.sleep(seconds)
        browser.busy_s += seconds  # the page's time, not the caller's
    elif kind == "go_back":
        browser.go_back()
    elif kind == "navigate":
        try:
            browser.navigate(action.text or "")
        except NavigationBlocked as exc:
            error = str(exc)
        except PageNotLoaded as exc:   # the agent's URL, as a link to it would: Chromium's error page shows
            error = f"navigation to {action.text!r} failed: the page did not load ({exc.reason})"
    else:
        raise ValueError(f"Browser.perform cannot execute a {kind!r} action")
    if kind in ("click", "type", "key", "scroll"):
        browser.settle()
    popup = browser.follow_popup()
    blocked = browser.enforce_allowlist() if check_url else None
    blocked = blocked or popup
    if blocked and error is None:
        error = blocked_message(blocked)
    return {"navigation_blocked": blocked, "action_error": error}
