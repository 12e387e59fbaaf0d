"""Scripted oracle policies for MiniWoB++ tasks: they emit model-style text.

An oracle is a function `oracle(env) -> Action` that looks at the current page of a `MiniWobEnv` (through
`env.goal`, `env.run_js` and `env.element_point`) and returns the next action. `oracle_text` formats it with
`format_action`, so driving the env through oracles also exercises the action parser end to end; the same text
serves as supervised demonstrations (the family's record hands the oracle to `eval.demos` and the doctor).

    result = run_episode(env, seed=0, oracle=task_oracle("miniwob/click-test"))   # jaxwebrl.env.tasks.episode
"""

from __future__ import annotations

import re
import time
from typing import Callable

from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.tasks.episode import OracleError
from jaxwebrl.env.tasks.miniwob.miniwob import MiniWobEnv

Oracle = Callable[[MiniWobEnv], Action]
ORACLES: dict[str, Oracle] = {}


def register(*tasks: str):
    def wrap(fn: Oracle) -> Oracle:
        for task in tasks:
            ORACLES[task] = fn
        return fn

    return wrap


def oracle_tasks() -> list[str]:
    return sorted(ORACLES)


def get_oracle(task: str) -> Oracle:
    """The oracle of a MiniWoB++ task name ("click-test")."""
    if task not in ORACLES:
        raise KeyError(f"no oracle for MiniWoB++ task {task!r}; oracles exist for {oracle_tasks()}")
    return ORACLES[task]


def oracle_text(env: MiniWobEnv) -> str:
    """The oracle's next action for env's current page, as model text."""
    return format_action(get_oracle(env.task)(env))


# ---- helpers --------------------------------------------------------------------------------------------
def _quoted(env: MiniWobEnv, count: int = 1) -> list[str]:
    """The first `count` "double-quoted" strings of the goal (labels, texts, credentials)."""
    found = re.findall(r'"([^"]*)"', env.goal)
    if len(found) < count:
        raise OracleError(f"{env.task}: expected {count} quoted string(s) in the goal {env.goal!r}")
    return found[:count]


def _goal_match(env: MiniWobEnv, pattern: str) -> re.Match:
    match = re.search(pattern, env.goal)
    if not match:
        raise OracleError(f"{env.task}: goal {env.goal!r} does not match {pattern!r}")
    return match


def _click(env: MiniWobEnv, element) -> Action:
    """A click on the element: on a point of the task's declared click grid when it has one (what a policy
    decoding under that grid can emit), else at its visible centre."""
    point = env.element_point(element) if env.click_grid is None else env.grid_point(element, env.click_grid)
    if point is None:
        raise OracleError(f"{env.task}: element {element!r} is not on the page")
    return Action("click", x=point[0], y=point[1])


def _find(env: MiniWobEnv, selector: str, text: str | None = None, attr: str = "textContent"):
    """First element matching selector (and whose trimmed `attr` equals text, when given)."""
    element = env.run_js(
        "var els = document.querySelectorAll(arguments[0]);"
        "for (var i = 0; i < els.length; i++) {"
        "  if (arguments[1] === null || (els[i][arguments[2]] || '').trim() === arguments[1]) { return els[i]; }"
        "} return null;", selector, text, attr)
    if element is None:
        raise OracleError(f"{env.task}: no {selector!r} with {attr} {text!r}")
    return element


def _fill(env: MiniWobEnv, selector: str, target: str) -> Action | None:
    """Next action to make input `selector` hold `target`, or None once it does."""
    value, focused, all_selected = env.run_js(
        "var el = document.querySelector(arguments[0]);"
        "return [el.value, document.activeElement === el,"
        "        el.selectionStart === 0 && el.selectionEnd === el.value.length];", selector)
    if value == target:
        return None
    if not focused:
        point = env.element_point(selector)
        if value:
            return Action("click", x=point[0], y=point[1])
        return Action("type", x=point[0], y=point[1], text=target)
    if value and not all_selected:
        return Action("key", keys=("ctrl", "a"))  # select the wrong text, so typing replaces it
    return Action("type", text=target)


# ---- oracles --------------------------------------------------------------------------------------------
@register("click-test", "click-test-2")
def click_test(env: MiniWobEnv) -> Action:
    return _click(env, "#subbtn")


@register("click-button-sequence")
def click_button_sequence(env: MiniWobEnv) -> Action:
    pushed = env.run_js("return buttonsPushed.length;")
    return _click(env, "#subbtn" if pushed == 0 else "#subbtn2")


@register("click-button")
def click_button(env: MiniWobEnv) -> Action:
    (label,) = _quoted(env)
    return _click(env, _find(env, "#area button", label))


@register("click-link")
def click_link(env: MiniWobEnv) -> Action:
    (label,) = _quoted(env)
    return _click(env, _find(env, "#area .alink", label))


@register("click-dialog")
def click_dialog(env: MiniWobEnv) -> Action:
    return _click(env, ".ui-dialog-titlebar button.ui-button")


@register("click-dialog-2")
def click_dialog_2(env: MiniWobEnv) -> Action:
    (label,) = _quoted(env)
    if label == "x":
        return _click(env, ".ui-dialog-titlebar button.ui-button")
    return _click(env, _find(env, ".ui-dialog-buttonset button", label))


@register("click-tab")
def click_tab(env: MiniWobEnv) -> Action:
    number = _goal_match(env, r"Tab #(\d+)").group(1)
    return _click(env, f'#area ul a[href="#tabs-{number}"]')


@register("click-widget")
def click_widget(env: MiniWobEnv) -> Action:
    (kind,) = _quoted(env)
    return _click(env, f'#area .widget [data-type="{kind}"]')


@register("focus-text")
def focus_text(env: MiniWobEnv) -> Action:
    return _click(env, "#tt")


@register("focus-text-2")
def focus_text_2(env: MiniWobEnv) -> Action:
    position = _goal_match(env, r"the (\d)(?:st|nd|rd|th) input").group(1)
    return _click(env, f"#tt{position}")


def _choose(env: MiniWobEnv, wanted: set[str]) -> Action:
    """Toggle the first #boxes input whose checked state disagrees with `wanted` labels; else submit."""
    labels = env.run_js(
        "return Array.from(document.querySelectorAll('#boxes label')).map("
        "  function (l) { return [l.textContent.trim(), l.querySelector('input').checked]; });")
    for index, (name, checked) in enumerate(labels):
        if (name in wanted) != checked:
            return _click(env, f"#ch{index}")
    return _click(env, "#subbtn")


@register("click-option")
def click_option(env: MiniWobEnv) -> Action:
    return _choose(env, {_goal_match(env, r"^Select (.*) and click Submit\.").group(1)})


@register("click-checkboxes")
def click_checkboxes(env: MiniWobEnv) -> Action:
    names = _goal_match(env, r"^Select (.*) and click Submit\.").group(1)
    return _choose(env, set() if names == "nothing" else set(names.split(", ")))


def _fill_then_submit(env: MiniWobEnv, fields: list[tuple[str, str]]) -> Action:
    for selector, target in fields:
        action = _fill(env, selector, target)
        if action is not None:
            return action
    return _click(env, "#subbtn")


@register("enter-text")
def enter_text(env: MiniWobEnv) -> Action:
    (text,) = _quoted(env)
    return _fill_then_submit(env, [("#tt", text)])


@register("enter-text-2")
def enter_text_2(env: MiniWobEnv) -> Action:
    (text,) = _quoted(env)
    target = text.upper() if "upper case" in env.goal else text.lower()
    return _fill_then_submit(env, [("#tt", target)])


@register("enter-password")
def enter_password(env: MiniWobEnv) -> Action:
    (password,) = _quoted(env)
    return _fill_then_submit(env, [("#password", password), ("#verify", password)])


@register("login-user")
def login_user(env: MiniWobEnv) -> Action:
    user, password = _quoted(env, 2)
    return _fill_then_submit(env, [("#username", user), ("#password", password)])


@register("click-collapsible")
def click_collapsible(env: MiniWobEnv) -> Action:
    expanded, animating = env.run_js(
        "return [$('.ui-accordion-content:visible').length === 1, $('#area :animated').length > 0];")
    if animating:
        return Action("wait", seconds=0.3)  # the accordion slides open; clicking now would miss
    if not expanded:
        return _click(env, "#area h3")
    return _click(env, "#subbtn")


@register("guess-number")
def guess_number(env: MiniWobEnv) -> Action:
    """Binary search driven by the page's feedback ("higher than X" / "lower than X"). The bounds learnt so
    far live in the page (window.__oracleBounds, keyed by episode), so the oracle stays a function of the page."""
    value, focused, guess = env.run_js("""
        var b = window.__oracleBounds;
        if (!b || b.episode !== WOB_EPISODE_ID) { b = window.__oracleBounds = {episode: WOB_EPISODE_ID, lo: 0, hi: 9}; }
        var higher = $('#higher:visible span').text(), lower = $('#lower:visible span').text();
        if (higher !== '') { b.lo = Math.max(b.lo, parseInt(higher, 10) + 1); }
        if (lower !== '') { b.hi = Math.min(b.hi, parseInt(lower, 10) - 1); }
        var tt = document.getElementById('tt');
        return [tt.value, document.activeElement === tt, Math.floor((b.lo + b.hi) / 2)];""")
    if value == "":
        point = env.element_point("#tt", x_fraction=0.2)  # left of the number field's spin buttons
        return Action("type", x=point[0], y=point[1], text=f"{guess}\n")  # Enter submits the form
    if not focused:
        point = env.element_point("#tt", x_fraction=0.2)  # the caret lands after the one-digit value
        return Action("click", x=point[0], y=point[1])
    return Action("key", keys=("Backspace",))  # clear the last guess, then type the next one


@register("click-checkboxes-large")
def click_checkboxes_large(env: MiniWobEnv) -> Action:
    """Toggle each label whose box disagrees with the goal (labels hold their inputs #ch0...), then Submit."""
    names = _goal_match(env, r"^Select (.*) and click Submit\.").group(1)
    wanted = set() if names == "nothing" else set(names.split(", "))
    labels = env.run_js("return Array.from(document.querySelectorAll('#area label')).map("
                        "  function (l) { return [l.textContent.trim(), l.querySelector('input').checked]; });")
    for index, (name, checked) in enumerate(labels):
        if (name in wanted) != checked:
            return _click(env, env.run_js("return document.querySelectorAll('#area label')[arguments[0]];", index))
    return _click(env, "#subbtn")


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


@register("choose-date")
def choose_date(env: MiniWobEnv) -> Action:
    """Open the datepicker, page with Prev/Next to the goal's month, click its day, then Submit. Waits (in
    Python, not a step) for the picker's fade to end, so a click never lands on a half-shown calendar."""
    month, day, year = (int(v) for v in _goal_match(env, r"Select (\d\d)/(\d\d)/(\d{4}) ").groups())
    deadline = time.monotonic() + 2.0
    while env.run_js("return $('#ui-datepicker-div').is(':animated');") and time.monotonic() < deadline:
        time.sleep(0.05)
    value, shown, title = env.run_js(
        "var d = $('#ui-datepicker-div'); return [$('#datepicker').val(), d.is(':visible'),"
        " [d.find('.ui-datepicker-month').text(), d.find('.ui-datepicker-year').text()]];")
    if value == f"{month:02d}/{day:02d}/{year}":
        return _click(env, "#subbtn")
    if not shown:
        return _click(env, "#datepicker")
    at = (int(title[1]), _MONTHS.index(title[0]) + 1)
    if at != (year, month):
        return _click(env, ".ui-datepicker-prev" if at > (year, month) else ".ui-datepicker-next")
    return _click(env, _find(env, "#ui-datepicker-div .ui-datepicker-calendar a", str(day)))
