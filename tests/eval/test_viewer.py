"""The trajectory viewer (eval/index.html) of a real scripted evaluation, opened from file:// in headless Chromium:
every episode and step renders, every screenshot loads, the filters hide episodes, and a model response holding
`<script>` is shown as text and never runs."""

import math
import os
import shutil

import numpy as np
import pytest

from jaxwebrl.buffer.trajectory import EpisodeView, StepView
from jaxwebrl.env.browser.chromium import BrowserConfig, ChromiumProcess, check_installation
from jaxwebrl.eval.evaluate import evaluate
from jaxwebrl.seeds import EVAL_SEED_START
from jaxwebrl.eval.viewer import render
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.scripted import ScriptedBackend, toy_oracle_responder
from tests.eval.trained import toy_config

HOSTILE = "Memory: {\"note\": \"<b>bold</b>\"}\nAction: <script>document.body.dataset.pwned = 'yes'</script>"


def _hostile_oracle(buffer):
    """The toy oracle (epsilon 0.2: some episodes fail), except that about one step in seven answers with a script.
    An episode then succeeds about 1 time in 2 (each of three turns: 0.85 x 0.9); the eval seeds every step, so the
    outcomes are fixed (both kinds among the 12)."""
    oracle = toy_oracle_responder(0.2)

    def respond(request, rng):
        if rng.random() < 0.15:
            return HOSTILE, math.log(0.15)
        return oracle(request, rng)

    return ScriptedBackend(respond, processor=tiny_processor(), fetch_image=buffer.screenshots.get, seed=0)


def _browser_available():
    try:
        check_installation(BrowserConfig())
        return True
    except FileNotFoundError:
        return False


def _save_artifact(png: bytes, tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(png)
    if os.environ.get("JAXWEBRL_ARTIFACTS"):
        os.makedirs(os.environ["JAXWEBRL_ARTIFACTS"], exist_ok=True)
        shutil.copy(path, os.path.join(os.environ["JAXWEBRL_ARTIFACTS"], name))
    return str(path)


def _visible(driver) -> int:
    return driver.execute_script("return [...document.querySelectorAll('section.episode')]"
                                 ".filter(e => !e.hidden && e.offsetParent !== null).length")


def _select(driver, select_id: str, value: str) -> None:
    driver.execute_script("const s = document.getElementById(arguments[0]); s.value = arguments[1];"
                          "s.dispatchEvent(new Event('change'));", select_id, value)


def test_render_escapes_every_model_and_page_string():
    evil = '"><script>alert(1)</script>'
    step = StepView(index=0, screenshot_ref=3, prompt=evil, response=evil, memory=evil, action=evil, feedback=evil,
                    reward=0.0, invalid=True)
    view = EpisodeView(episode_id=1, task_id=evil, seed=None, reward=0.0, outcome="failure",
                       failure_reason=evil, steps=[step])
    page = render([(evil, view)], title=evil)
    assert page.count("<script>") == 1                 # the page's own filter script, nothing else
    assert "alert(1)</script>" not in page
    # title x2, task option value + text, data-task, h2, failure reason, 5 step texts
    assert page.count("&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;") == 12
    assert 'data-task="&quot;&gt;&lt;script&gt;' in page


@pytest.mark.skipif(not _browser_available(), reason="Chromium/chromedriver not installed")
def test_viewer_of_a_scripted_eval_in_chromium(tmp_path):
    config = toy_config()
    config.model.max_new_tokens = 128      # the scripted responses are longer than the tiny policy's budget
    out_dir = tmp_path / "run_eval"
    report = evaluate(config, None, seeds=range(EVAL_SEED_START, EVAL_SEED_START + 6), episodes_per_seed=2,
                      num_workers=1, out_dir=str(out_dir), make_handler=_hostile_oracle, title="scripted")
    rows = report["episodes"]
    page = out_dir / "eval" / "index.html"
    assert page.exists() and len(rows) == 12
    successes = sum(r["reward"] > 0 for r in rows)
    assert 0 < successes < len(rows)                   # both outcomes present, so the filter has work to do
    shots = list((out_dir / "eval" / "shots").glob("*.png"))
    assert shots and all(s.stat().st_size > 0 for s in shots)

    browser = ChromiumProcess(BrowserConfig(viewport=(1280, 1400), egress_proxy=False, guard_requests=False))
    try:
        driver = browser.driver
        folder = browser.expose_directory(str(out_dir / "eval"))
        driver.get("file://" + os.path.join(folder, "index.html"))
        assert driver.execute_script("return document.querySelectorAll('section.episode').length") == len(rows)
        assert driver.execute_script("return document.querySelectorAll('tr.step').length") == sum(
            r["steps"] for r in rows)
        images = driver.execute_script(
            "return [...document.images].map(i => [i.complete, i.naturalWidth, i.getAttribute('src')])")
        assert len(images) == sum(r["steps"] for r in rows)
        assert all(complete and width > 0 for complete, width, _ in images), images
        # the hostile response is on the page as text, and its script never ran
        responses = driver.execute_script("return [...document.querySelectorAll('pre.response')]"
                                          ".map(p => p.textContent)")
        assert any("<script>document.body.dataset.pwned" in r for r in responses)
        assert driver.execute_script("return document.body.dataset.pwned") is None
        assert driver.execute_script("return document.querySelectorAll('script').length") == 1
        assert driver.execute_script("return document.querySelectorAll('pre b').length") == 0
        # filters: outcome, then task on top of it
        assert _visible(driver) == len(rows)
        assert driver.find_element("id", "shown").text == f"{len(rows)} of {len(rows)} episodes shown"
        _select(driver, "outcome-filter", "success")
        assert _visible(driver) == successes
        label = rows[0]["task"]
        _select(driver, "task-filter", label)
        assert _visible(driver) == sum(r["reward"] > 0 and r["task"] == label for r in rows)
        _select(driver, "outcome-filter", "failure")
        assert _visible(driver) == sum(r["reward"] <= 0 and r["task"] == label for r in rows)
        _select(driver, "task-filter", "")
        _select(driver, "outcome-filter", "")
        png = driver.get_screenshot_as_png()
    finally:
        browser.close()
    path = _save_artifact(png, tmp_path, "viewer.png")
    assert np.frombuffer(open(path, "rb").read(8), np.uint8).tobytes() == b"\x89PNG\r\n\x1a\n"
