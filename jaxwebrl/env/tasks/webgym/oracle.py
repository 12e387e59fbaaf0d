"""The oracle of a WebGym task that carries its `solution` (the bundled sites' tasks do): a plan of steps on CSS
selectors, played one per env step through the action language.

    {"click": "#cat-kitchen"}          a click at the centre of the first element the selector matches
    {"type": ["#q", "cache_size"]}     a click into it and the text typed
    {"answer": "4.20"}                 the answer that ends the episode, given only where the page shows it

The point is the element's centre in the 0..1000 coordinates of the viewport the screenshot shows; an element that
is missing or outside the viewport, or an answer the page reached does not show, is an `OracleError` (the page is
not what the plan expects), so an oracle win means the plan really reaches the answer on the site.
"""

from __future__ import annotations

from jaxwebrl.env.agent.actions import Action, from_viewport
from jaxwebrl.env.tasks.episode import OracleError

_CENTRE_JS = """var el = document.querySelector(arguments[0]);
if (!el) { return null; }
var r = el.getBoundingClientRect();
if (r.width === 0 || r.height === 0 || r.bottom < 0 || r.top > innerHeight) { return null; }
return [r.left + r.width / 2, r.top + r.height / 2, innerWidth, innerHeight];"""
STEP_KINDS = ("click", "type", "answer")


def check_solution(solution) -> list[dict]:
    """The plan as given when every step is one of STEP_KINDS with its value; ValueError naming the step."""
    if not isinstance(solution, list) or not solution or "answer" not in solution[-1]:
        raise ValueError("'solution' must be a non-empty list of steps ending with {\"answer\": ...}")
    for n, step in enumerate(solution):
        ok = isinstance(step, dict) and len(step) == 1 and next(iter(step)) in STEP_KINDS
        value = next(iter(step.values())) if ok else None
        texts = ((value if isinstance(value, list) and len(value) == 2 else [None]) if ok and "type" in step
                 else [value])   # the strings the step needs: a selector and a text for "type", else one
        if not ok or not all(isinstance(v, str) and v for v in texts):
            raise ValueError(f"'solution' step {n} {step!r}: use {{\"click\": selector}}, {{\"type\": [selector, "
                             f"text]}} or {{\"answer\": text}}")
    return solution


def plan_oracle(solution: list[dict]):
    """An oracle (`jaxwebrl.env.families.Oracle`) that plays `solution`, step `step` at env step `step`."""
    def oracle(env, observation, step: int) -> Action:
        if step >= len(solution):
            raise OracleError(f"{env.task_id}: the plan has {len(solution)} steps and the episode did not end")
        (kind, value), = solution[step].items()
        if kind == "answer":
            if value not in (env.run_js("return document.body.innerText;") or ""):
                raise OracleError(f"{env.task_id}: the answer {value!r} is not on {env.run_js('return location.href;')}")
            return Action("answer", text=value)
        selector = value[0] if kind == "type" else value
        centre = env.run_js(_CENTRE_JS, selector)
        if centre is None:
            raise OracleError(f"{env.task_id}: step {step}: no visible {selector!r} on {env.run_js('return location.href;')}")
        x, y = from_viewport(*centre)
        return Action("click", x=x, y=y) if kind == "click" else Action("type", x=x, y=y, text=value[1])

    return oracle
