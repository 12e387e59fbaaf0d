"""Errors name their real cause (issue 32.4), in real headless Chromium: a task's own evaluator that raises is a
task-spec fault naming the file, the evaluator and the message; a start page that does not load, a page that opens
windows without end, one that leaves its allowed origin at once, and one that hits the renderer memory limit each
end their episode as a PageFault naming the reason; none of them blames the browser installation."""

import json
import logging
import socket

import pytest

from configs import base
from jaxwebrl.buffer.ring import RingBuffer
from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.agent.prompt import read_goal_and_step
from jaxwebrl.env.base import BrowserCrashed, PageFault, TaskSpecFault, browser_is_the_cause
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.browser.memory_bound import PROCESS_BOUND
from jaxwebrl.env.browser.navigation import MAX_POPUPS
from jaxwebrl.env.browser.probes import serve_directory
from jaxwebrl.env.registry import make_env
from jaxwebrl.models.processor import tiny_processor
from jaxwebrl.rollout.client import InProcessClient
from jaxwebrl.rollout.scripted import ScriptedBackend, random_choice_responder
from jaxwebrl.rollout.spec import worker_fields
from jaxwebrl.rollout.worker import EnvGivenUp, RolloutWorker, WorkerConfig, given_up_message

pytestmark = pytest.mark.browser
VIEWPORT = (200, 200)
CLICK = format_action(Action("click", x=500, y=500))
WAIT = format_action(Action("wait", seconds=0.0))
BUTTON = '<!doctype html><html><body style="margin:0"><button style="width:200px;height:200px" onclick="{}">go' \
         '</button></body></html>'
PAGES = {
    "index.html": "<!doctype html><html><body><p id='x'>hi</p></body></html>",
    "popups.html": BUTTON.format("setInterval(() => window.open('index.html'), 5)"),
    # the page's own allocation loop (JS heap): the renderer dies at its RLIMIT_DATA
    "grow.html": BUTTON.format("window.keep = []; setInterval(() => { for (let i = 0; i < 20; i++) "
                               "keep.push(new Array(1 << 20).fill(keep.length)); }, 1)"),
    # ArrayBuffers (outside the JS heap), touched so they are resident: 32 MB every 50 ms from 1 s after the click
    "buffers.html": BUTTON.format("window.keep = []; setTimeout(() => setInterval(() => "
                                  "keep.push(new Uint8Array(32 << 20).fill(1)), 50), 1000)"),
}
THROWING_PY = "def check(ctx):\n    raise ValueError('no price on the page')\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults_site")
    for name, html in PAGES.items():
        (root / name).write_text(html)
    server, url, _ = serve_directory(str(root))
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    with Browser(BrowserConfig(viewport=VIEWPORT)) as b:
        yield b


def spec_file(tmp_path, start_url, evaluator=None, name="task.json", max_steps=3):
    spec = {"task_id": "faults/test", "start_url": start_url, "goal": "do it", "max_steps": max_steps,
            "viewport": list(VIEWPORT), "evaluator": evaluator or {"type": "js", "expression": "false"}}
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return str(path)


def test_a_js_evaluator_that_throws_is_a_task_spec_fault_naming_file_evaluator_and_message(site, browser, tmp_path):
    expression = "document.querySelector('#nope').value === 'x'"
    path = spec_file(tmp_path, f"{site}/index.html", {"type": "js", "expression": expression})
    env = make_env(path, browser=browser)
    env.reset(0)
    with pytest.raises(TaskSpecFault) as err:
        env.step(WAIT)
    text = str(err.value)
    assert text.startswith(f"task spec {path}: its js evaluator {expression!r} raised PageScriptError")
    assert "Cannot read properties of null" in text and "\n" not in text
    assert browser.alive and not browser_is_the_cause(err.value)   # the browser was fine all along
    assert "fix its spec, page or evaluator" in given_up_message("faults/test", 4, err.value)


def test_a_python_evaluator_that_raises_is_a_task_spec_fault(site, browser, tmp_path, monkeypatch):
    (tmp_path / "throwing_evaluators.py").write_text(THROWING_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = spec_file(tmp_path, f"{site}/index.html", {"type": "python", "function": "throwing_evaluators.check"})
    env = make_env(path, browser=browser)
    env.reset(0)
    with pytest.raises(TaskSpecFault, match=r"its python evaluator 'throwing_evaluators.check' raised ValueError: "
                                            r"no price on the page: fix the evaluator"):
        env.step(WAIT)


def test_a_python_evaluator_that_is_not_a_function_is_a_task_spec_fault(site, browser, tmp_path, monkeypatch):
    """A name that imports but is no function of its module fails building the env as the spec's fault (the
    worker's one-line give-up), not as an exception that crash-loops the worker."""
    (tmp_path / "constant_evaluators.py").write_text("THRESHOLD = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = spec_file(tmp_path, f"{site}/index.html", {"type": "python", "function": "constant_evaluators.THRESHOLD"})
    with pytest.raises(TaskSpecFault, match=r"must be a Python function defined in 'constant_evaluators' \(got int\): "
                                            r"fix its evaluator's 'function'") as err:
        make_env(path, browser=browser)
    assert str(err.value).startswith(f"task spec {path}: ") and not browser_is_the_cause(err.value)


def test_a_start_page_that_does_not_load_is_a_page_fault_naming_the_url(site, browser, tmp_path):
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/index.html"
    for url, why in ((dead, "net::ERR_"), (f"{site}/missing.html", "HTTP status 404")):
        env = make_env(spec_file(tmp_path, url), browser=browser)
        with pytest.raises(PageFault, match=f"the page {url} did not load \\(.*{why}") as err:
            env.reset(0)
        assert not browser_is_the_cause(err.value) and "\n" not in str(err.value)
    assert browser.alive


def test_a_page_that_opens_windows_without_end_ends_its_episode_as_a_page_fault(site, browser, tmp_path):
    env = make_env(spec_file(tmp_path, f"{site}/popups.html"), browser=browser)
    env.reset(0)
    with pytest.raises(PageFault, match=f"the page opened \\d+ windows since the last look \\(at most {MAX_POPUPS}"):
        env.step(CLICK)
    env = make_env(spec_file(tmp_path, f"{site}/index.html", name="next.json"), browser=browser)
    assert env.reset(1).url.endswith("/index.html")   # the next episode gets a fresh browser, one tab


def test_a_page_that_leaves_its_origin_at_once_is_a_page_fault_not_steps_on_about_blank(browser, tmp_path):
    """Issue 32: a file:// task whose page went to file:///etc/passwd was blocked, left on about:blank, and played."""
    task = tmp_path / "leaving"
    task.mkdir()
    (task / "index.html").write_text("<!doctype html><script>location.href = 'file:///etc/passwd'</script>")
    env = make_env(spec_file(task, "index.html"), browser=browser)
    with pytest.raises(PageFault, match="left its allowed origin for file:///etc/passwd"):
        env.reset(0)


def test_a_page_that_hits_the_memory_limit_env_fails_naming_the_limit(site, tmp_path):
    with Browser(BrowserConfig(viewport=VIEWPORT, memory_limit_mb=512)) as small:
        env = make_env(spec_file(tmp_path, f"{site}/grow.html"), browser=small)
        env.reset(0)
        with pytest.raises(PageFault, match="renderer memory limit of 512 MB a Chromium process"):
            env.step(CLICK)   # the page allocates on its own from here; a later step meets its crashed tab
            for _ in range(2):
                env.step(format_action(Action("wait", seconds=1.0)))
        assert not small.alive    # the crashed tab's browser is replaced at the next reset


def test_only_a_failure_of_the_browser_itself_points_at_its_installation():
    assert "check the browser installation" in given_up_message("t", 4, BrowserCrashed("chromedriver died"))
    for fault in (PageFault("the page opened 9 windows"), TaskSpecFault("task spec x.json: its js evaluator")):
        line = given_up_message("t", 4, fault)
        assert "check the browser installation" not in line and "fix its spec, page or evaluator" in line


def test_a_worker_whose_start_page_does_not_load_gives_up_naming_the_url_not_the_browser(tmp_path):
    """Issue 32.2: such a spec was played as a normal task (269 episodes of reward 0); now every reset is a
    PageFault and the worker gives up on it with one line that names the URL and points at the task."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/index.html"
    buffer = RingBuffer.create(str(tmp_path / "buf"), capacity_steps=64, max_seq_len=1024,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    backend = ScriptedBackend(random_choice_responder(["wait(0)"]), processor=tiny_processor(),
                              fetch_image=buffer.screenshots.get)
    config = WorkerConfig(tasks=(spec_file(tmp_path, dead),), group_size=1, max_env_retries=1, prompt={"window": 0},
                          env_options={"screenshot_size": [64, 64]})
    worker = RolloutWorker(config, InProcessClient(backend), buffer)
    try:
        with pytest.raises(EnvGivenUp) as err:
            worker.run(max_groups=1)
    finally:
        worker.close()
    line = str(err.value)
    # PageNotLoaded: the PageFault of a page that did not load with the browser fine (an agent's own navigate there
    # is an action error instead, tests/env/test_webtask.py)
    assert f"PageNotLoaded: the page {dead} did not load" in line and "fix its spec, page or evaluator" in line
    assert "check the browser installation" not in line and worker.stats.env_failures == 2


def test_a_file_start_page_gone_after_validation_is_a_page_fault_naming_the_file_or_its_folder(browser, tmp_path):
    """Issue 44.5: a missing file:// page was told "nothing answered there; start its server", and a page in a
    missing folder surfaced as _EnvBroken ... FileNotFoundError."""
    for gone in ("file", "folder"):
        task = tmp_path / gone / "task"
        task.mkdir(parents=True)
        (task / "index.html").write_text(PAGES["index.html"])
        env = make_env(spec_file(tmp_path / gone, str(task / "index.html")), browser=browser)   # validated here
        (task / "index.html").unlink()
        if gone == "folder":
            task.rmdir()
        with pytest.raises(PageFault) as err:
            env.reset(0)
        line = str(err.value)
        expected = f"the file {task / 'index.html'} does not exist" if gone == "file" else \
            f"folder {task} does not exist"
        assert expected in line and "start its server" not in line and "\n" not in line, line
        assert not browser_is_the_cause(err.value)


def test_a_spec_whose_file_start_page_is_missing_is_refused_before_any_browser(tmp_path):
    (tmp_path / "task").mkdir()
    for start_url, missing in ((str(tmp_path / "task" / "nope.html"), "the file"),
                               (f"file://{tmp_path}/no_folder/index.html", "the page's folder"),
                               ("nope.html", "the file")):
        with pytest.raises(ValueError, match=f"'start_url'.*{missing} .* does not exist"):
            make_env(spec_file(tmp_path, start_url))


def click_then_wait(request, rng):
    """A scripted policy: click (the page's button) at step 0, then wait a second each step."""
    step = read_goal_and_step(request["messages"])[1]
    return f"Memory: {{}}\nAction: {CLICK if step == 0 else format_action(Action('wait', seconds=1.0))}", 0.0


def test_a_page_over_the_workers_memory_bound_is_a_page_fault_and_the_next_episode_plays_in_a_fresh_browser(
        site, tmp_path, caplog):
    """Issue 44.9: an ArrayBuffer loop reached 2.2 GB with no fault. Now the worker's one bound over its browsers
    (env.browser_memory_mb) kills that browser: its episode is an env-failed PageFault naming the bound and the fix,
    counted once and logged in one line; the worker's next episode plays in a fresh browser and is kept whole."""
    buffer = RingBuffer.create(str(tmp_path / "buf"), capacity_steps=64, max_seq_len=1024,
                               screenshot_shape=(64, 64, 3), max_images_per_step=1)
    backend = ScriptedBackend(click_then_wait, processor=tiny_processor(), fetch_image=buffer.screenshots.get)
    greedy = spec_file(tmp_path, f"{site}/buffers.html", name="greedy.json", max_steps=5)
    plain = spec_file(tmp_path, f"{site}/index.html", name="plain.json", max_steps=2)
    run = base.config()
    run.env.browser_memory_mb = 600   # through the run config's worker spec, as a worker process gets it
    config = WorkerConfig(tasks=(greedy, plain), group_size=1, prompt={"window": 0},
                          env_options=dict(worker_fields(run)["env_options"], screenshot_size=[64, 64]))
    worker = RolloutWorker(config, InProcessClient(backend), buffer)
    breaches = PROCESS_BOUND.breaches
    try:
        with caplog.at_level(logging.WARNING, logger="jaxwebrl.rollout.worker"):
            worker.run_group(greedy, 0)
            worker.run_group(plain, 0)
    finally:
        worker.close()
    (failed, played), _ = buffer.read(group_size=1)
    assert failed.env_failed and not failed.terminated and failed.reward == 0.0 and 1 <= failed.num_steps < 5
    assert "PageFault" in failed.info["env_failure"] and "over env.browser_memory_mb = 600 MB" in \
        failed.info["env_failure"] and "raise env.browser_memory_mb" in failed.info["env_failure"]
    assert not played.env_failed and played.num_steps == 2   # in a fresh browser: the greedy one was killed
    assert worker.stats.env_failures == 1 and worker.stats.episodes == 2 and PROCESS_BOUND.breaches == breaches + 1
    lines = [r.getMessage() for r in caplog.records if "env.browser_memory_mb" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]   # no retries on a killed chromedriver
