"""The trajectory viewer: one static HTML page of every evaluation episode, step by step.

    path = write_viewer(episodes, buffer.screenshots.get, "DIR/eval", title="initial")   # DIR/eval/index.html

Each episode shows its task, seed, outcome, reward and failure reason, and per step the screenshot the policy
answered (PNG files in `shots/` next to the page), the prompt excerpt, the model's response, the memory, the
action, the feedback and the reward (`jaxwebrl.buffer.trajectory`). Two selects filter the episodes by task
and by outcome (plain JavaScript inline; nothing is fetched from the network; open the file in any browser).

Every model- or page-provided string is HTML-escaped (a response is hostile input), and the page's Content
Security Policy runs only its own script (by hash) and loads images only from its own folder.
"""

from __future__ import annotations

import base64
import hashlib
import html
import os
from typing import Callable

import numpy as np
from PIL import Image

from jaxwebrl.buffer.episode import Episode
from jaxwebrl.buffer.trajectory import OUTCOMES, EpisodeView, episode_view
from jaxwebrl.eval.report import task_label

SHOTS_DIR = "shots"

_SCRIPT = """
(function () {
  var task = document.getElementById("task-filter");
  var outcome = document.getElementById("outcome-filter");
  var shown = document.getElementById("shown");
  function apply() {
    var episodes = document.querySelectorAll("section.episode");
    var count = 0;
    for (var i = 0; i < episodes.length; i++) {
      var e = episodes[i];
      var show = (!task.value || e.dataset.task === task.value) &&
                 (!outcome.value || e.dataset.outcome === outcome.value);
      e.hidden = !show;
      if (show) count++;
    }
    shown.textContent = count + " of " + episodes.length + " episodes shown";
  }
  task.addEventListener("change", apply);
  outcome.addEventListener("change", apply);
  apply();
})();
"""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
.filters { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #ccc; }
.filters label { margin-right: 1.5em; }
section.episode { margin: 1.2em 0; border: 1px solid #ccc; border-radius: 6px; padding: .6em 1em; }
section.episode[hidden] { display: none; }
section.episode h2 { font-size: 1.05em; margin: .2em 0; }
.success h2 .outcome { color: #1a7f37; } .failure h2 .outcome { color: #b42318; }
.env_failed h2 .outcome { color: #9a6700; }
.reason { color: #555; margin: .2em 0 .6em; }
table.steps { border-collapse: collapse; width: 100%; }
table.steps td, table.steps th { border-top: 1px solid #eee; padding: .4em; vertical-align: top; text-align: left; }
table.steps img { width: 200px; border: 1px solid #ddd; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: .85em; max-width: 36em; }
.invalid { color: #b42318; }
.memory { font-size: .85em; margin-top: .3em; }
"""


def write_viewer(episodes: list[Episode], fetch_image: Callable[[int], np.ndarray], out_dir: str, *,
                 title: str = "evaluation") -> str:
    """Write `out_dir`/index.html and the steps' screenshots (`out_dir`/shots/<ref>.png); returns the page's
    path. `episodes` as `RingBuffer.read` returns them; `fetch_image(ref)` -> uint8 [H, W, 3]."""
    os.makedirs(os.path.join(out_dir, SHOTS_DIR), exist_ok=True)
    labelled = sorted(((task_label(e), episode_view(e)) for e in episodes),
                      key=lambda lv: (lv[0], lv[1].seed or 0, lv[1].episode_id))
    written: set[int] = set()
    for _, view in labelled:
        for step in view.steps:
            if step.screenshot_ref >= 0 and step.screenshot_ref not in written:
                Image.fromarray(np.asarray(fetch_image(step.screenshot_ref), np.uint8)).save(
                    os.path.join(out_dir, SHOTS_DIR, f"{step.screenshot_ref}.png"))
                written.add(step.screenshot_ref)
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(labelled, title=title))
    return path


def render(labelled: list[tuple[str, EpisodeView]], *, title: str) -> str:
    """The page (a string) for (task label, episode view) pairs; images are referenced as shots/<ref>.png."""
    labels = [label for label, _ in labelled]
    views = [view for _, view in labelled]
    counts = {o: sum(v.outcome == o for v in views) for o in OUTCOMES}
    task_options = "".join(f'<option value="{_e(t)}">{_e(t)}</option>' for t in sorted(set(labels)))
    outcome_options = "".join(f'<option value="{o}">{o.replace("_", " ")} ({counts[o]})</option>' for o in OUTCOMES)
    body = "\n".join(_episode_html(v, label) for v, label in zip(views, labels))
    digest = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    csp = f"default-src 'none'; img-src 'self' file: data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    summary = ", ".join(f"{counts[o]} {o.replace('_', ' ')}" for o in OUTCOMES)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f"<title>{_e(title)}: trajectories</title>\n<style>{_STYLE}</style></head>\n<body>\n"
            f"<h1>{_e(title)}: {len(views)} episodes</h1>\n<p id=\"summary\">{summary}</p>\n"
            f'<div class="filters"><label>Task <select id="task-filter"><option value="">all tasks</option>'
            f'{task_options}</select></label><label>Outcome <select id="outcome-filter">'
            f'<option value="">all outcomes</option>{outcome_options}</select></label>'
            f'<span id="shown"></span></div>\n{body}\n<script>{_SCRIPT}</script>\n</body></html>\n')


def _episode_html(view: EpisodeView, label: str) -> str:
    steps = "\n".join(_step_html(s) for s in view.steps)
    reason = f'<p class="reason">{_e(view.failure_reason)}</p>' if view.failure_reason else ""
    return (f'<section class="episode {view.outcome}" data-task="{_e(label)}" data-outcome="{view.outcome}" '
            f'id="episode-{view.episode_id}">\n<h2>{_e(label)} · seed {_e(view.seed)} · '
            f'<span class="outcome">{view.outcome.replace("_", " ")}</span> · reward {view.reward:g} · '
            f'{len(view.steps)} steps</h2>{reason}\n<table class="steps"><tr><th>step</th><th>screenshot</th>'
            f"<th>prompt (excerpt)</th><th>response and memory</th><th>action</th><th>reward</th></tr>\n"
            f"{steps}</table></section>")


def _step_html(step) -> str:
    image = (f'<img src="{SHOTS_DIR}/{step.screenshot_ref}.png" alt="screenshot of step {step.index + 1}">'
             if step.screenshot_ref >= 0 else "(no screenshot)")
    feedback = f'<div class="invalid">{_e(step.feedback)}</div>' if step.feedback else ""
    return (f'<tr class="step"><td>{step.index + 1}</td><td>{image}</td><td><pre>{_e(step.prompt)}</pre></td>'
            f'<td><pre class="response">{_e(step.response)}</pre>'
            f'<div class="memory">memory: <code>{_e(step.memory)}</code></div>'
            f'</td><td><code class="action{" invalid" if step.invalid else ""}">{_e(step.action)}</code>{feedback}'
            f"</td><td>{'–' if step.reward is None else f'{step.reward:g}'}</td></tr>")


def _e(value) -> str:
    """HTML-escaped text (quotes too: safe in attributes)."""
    return html.escape("" if value is None else str(value), quote=True)
