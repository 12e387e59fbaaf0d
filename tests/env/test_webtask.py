"""JSON web-task specs in real headless Chromium, served from a local http.server: every evaluator kind,
the navigation allowlist (agent navigate and page-initiated), file:// tasks (spec validation: test_task_spec.py)."""

import json
import os
import re
import socket
import time

import pytest

from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.base import TaskSpecFault
from jaxwebrl.env.registry import make_env
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.browser.probes import serve_directory
from jaxwebrl.env.tasks.webtask.webtask import WebTaskEnv, WebTaskSpec

pytestmark = pytest.mark.browser
VIEWPORT = (400, 300)

INDEX = """<!doctype html><html><body style="margin:0">
<button id="go" style="position:absolute;left:0;top:0;width:200px;height:100px"
  onclick="document.getElementById('out').textContent='done'">Go</button>
<a id="next" href="page2.html" style="position:absolute;left:200px;top:0;width:200px;height:100px;display:block">next</a>
<input id="name" style="position:absolute;left:0;top:100px;width:200px;height:50px">
<a id="away" href="OUTSIDE/evil.html"
   style="position:absolute;left:200px;top:100px;width:200px;height:100px;display:block">away</a>
<div id="out" style="position:absolute;left:0;top:200px">idle</div>
<img src="OUTSIDE/tracker.png" width="1" height="1">
<a id="tab" href="page2.html" target="_blank"
   style="position:absolute;left:0;top:250px;width:200px;height:50px;display:block">new tab</a>
</body></html>"""
PAGE2 = "<!doctype html><html><body><h1>Second page</h1></body></html>"
LONG = """<!doctype html><html><body style="margin:0">
<div id="dbl" style="height:150px;background:#ccc" ondblclick="this.textContent='double'">single</div>
<input id="a" style="display:block;height:40px"><input id="b" style="display:block;height:40px">
<div style="height:3000px"></div><div id="end">end of page</div></body></html>"""
EVALUATOR_MODULE = '''
def name_typed(ctx):
    """A pluggable evaluator: succeeds once the name field holds ctx.args['name']."""
    return ctx.run_js("return document.getElementById('name').value;") == ctx.args["name"]
'''

# 0..1000 coordinates over the 400 x 300 viewport
GO = Action("click", x=250, y=166)
NEXT = Action("click", x=750, y=166)
NAME = Action("type", x=250, y=416, text="Ada")
AWAY = Action("click", x=750, y=500)
NEW_TAB = Action("click", x=250, y=916)


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """A second local server that no task allows: it must never see a request."""
    root = tmp_path_factory.mktemp("outside")
    (root / "evil.html").write_text("<p>evil</p>")
    server, url, requests = serve_directory(str(root))
    yield url, requests
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def site(tmp_path_factory, outside):
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text(INDEX.replace("OUTSIDE", outside[0]))
    (root / "page2.html").write_text(PAGE2)
    (root / "long.html").write_text(LONG)
    server, url, _ = serve_directory(str(root))
    yield root, url
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    with Browser(BrowserConfig(viewport=VIEWPORT)) as b:
        yield b


def _env(site, browser, evaluator, **extra):
    spec = {"task_id": "local/test", "start_url": f"{site[1]}/index.html", "goal": "do the thing",
            "max_steps": 4, "difficulty": "easy", "evaluator": evaluator, "viewport": list(VIEWPORT), **extra}
    return make_env(spec, browser=browser)


def test_js_evaluator_succeeds_after_the_click(site, browser):
    env = _env(site, browser, {"type": "js", "expression": "document.getElementById('out').textContent === 'done'"})
    obs = env.reset(0)
    assert obs.goal == "do the thing" and obs.screenshot.shape == (300, 400, 3)
    assert obs.url.endswith("/index.html")
    first = env.step(format_action(Action("wait", seconds=0.0)))
    assert (first.reward, first.terminated, first.truncated) == (0.0, False, False)
    res = env.step(format_action(GO))
    assert (res.reward, res.terminated, res.info["success"]) == (1.0, True, True)
    assert not (res.observation.screenshot == obs.screenshot).all()


def test_url_match_evaluator_follows_a_link(site, browser):
    env = _env(site, browser, {"type": "url_match", "pattern": "/page2.html", "mode": "contains"})
    env.reset(0)
    res = env.step(format_action(NEXT))
    assert res.terminated and res.reward == 1.0 and res.observation.url.endswith("/page2.html")


def test_text_match_evaluator_and_truncation(site, browser):
    env = _env(site, browser, {"type": "text_match", "text": "DONE", "selector": "#out"}, max_steps=2)
    env.reset(0)
    res = env.step(format_action(NAME))  # typing alone does not satisfy the evaluator
    assert not res.done and res.reward == 0.0
    res = env.step(format_action(Action("scroll", direction="down", amount=100)))
    assert res.truncated and not res.terminated and res.reward == 0.0
    env.reset(1)
    assert env.step(format_action(GO)).reward == 1.0  # case-insensitive by default


def test_answer_match_evaluator_only_on_answer(site, browser):
    env = _env(site, browser, {"type": "answer_match", "answer": "Second page", "mode": "exact"})
    env.reset(0)
    res = env.step(format_action(NEXT))
    assert not res.done and res.reward == 0.0 and not res.info["evaluated"]
    res = env.step(format_action(Action("answer", text="  second   PAGE ")))
    assert res.terminated and res.reward == 1.0
    env.reset(0)
    res = env.step(format_action(Action("answer", text="first page")))
    assert res.terminated and res.reward == 0.0


def test_python_evaluator_by_dotted_name(site, browser, tmp_path, monkeypatch):
    (tmp_path / "my_evaluators.py").write_text(EVALUATOR_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = _env(site, browser, {"type": "python", "function": "my_evaluators.name_typed", "args": {"name": "Ada"}})
    env.reset(0)
    res = env.step(format_action(NAME))
    assert res.terminated and res.reward == 1.0
    with pytest.raises(ValueError, match="no package 'no_such_module_xyz'"):
        _env(site, browser, {"type": "python", "function": "no_such_module_xyz.fn"})
    with pytest.raises(TaskSpecFault, match="must be a Python function defined in 'my_evaluators'"):
        _env(site, browser, {"type": "python", "function": "my_evaluators.missing"})


def test_navigation_outside_allowlist_is_refused(site, outside, browser):
    env = _env(site, browser, {"type": "js", "expression": "false"}, max_steps=6)
    env.reset(0)
    # the page's subresource from another origin was failed inside the browser
    assert f"{outside[0]}/tracker.png" in browser.request_guard.blocked
    # the agent's own navigate: refused before any request, fed back as an action error
    res = env.step(format_action(Action("navigate", text=f"{outside[0]}/evil.html")))
    assert "outside the task allowlist" in res.info["action_error"]
    assert res.observation.url.endswith("/index.html") and not res.done
    # a link on the page that leaves the allowlist: blocked in the browser, then the task page comes back
    res = env.step(format_action(AWAY))
    assert res.info["navigation_blocked"] == f"{outside[0]}/evil.html"
    assert res.observation.url.endswith("/index.html")
    # navigation inside the allowlist works
    res = env.step(format_action(Action("navigate", text=f"{site[1]}/page2.html")))
    assert res.info["action_error"] is None and res.observation.url.endswith("/page2.html")
    res = env.step(format_action(Action("go_back")))
    assert res.observation.url.endswith("/index.html")
    # a popup and a cross-origin iframe: new targets are guarded before their first request
    env.run_js("window.open(arguments[0] + '/popup.html', '_blank');"
               "var f = document.createElement('iframe'); f.src = arguments[0] + '/frame.html';"
               "document.body.appendChild(f);", outside[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not {f"{outside[0]}/popup.html", f"{outside[0]}/frame.html"} <= set(
            browser.request_guard.blocked):
        time.sleep(0.05)
    assert {f"{outside[0]}/popup.html", f"{outside[0]}/frame.html"} <= set(browser.request_guard.blocked)
    assert outside[1] == [], "a request outside the allowlist reached the network"
    env.step(format_action(Action("wait", seconds=0.0)))
    assert browser.driver.window_handles == [browser.driver.current_window_handle]  # agents see one tab


def test_the_agents_navigate_to_an_allowed_page_that_does_not_load_is_an_action_error(site, browser):
    """Like a link to it: the agent's mistake is fed back and the episode goes on, never an env-failed episode
    (a PageFault that blamed the task's server and dropped the episode unscored)."""
    with socket.socket() as s:   # a port nothing listens on, inside the task's allowlist
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/index.html"
    env = _env(site, browser, {"type": "js", "expression": "false"}, allowlist=["http://127.0.0.1:*/*"])
    env.reset(0)
    res = env.step(format_action(Action("navigate", text=dead)))
    assert res.info["action_error"].startswith(f"navigation to {dead!r} failed: the page did not load (")
    assert "net::ERR_" in res.info["action_error"] and not res.done and browser.alive
    res = env.step(format_action(Action("navigate", text=f"{site[1]}/page2.html")))
    assert res.info["action_error"] is None and res.observation.url.endswith("/page2.html")


def test_allowed_new_tab_opens_in_the_task_tab(site, browser):
    env = _env(site, browser, {"type": "url_match", "pattern": "/page2.html", "mode": "contains"})
    env.reset(0)
    res = env.step(format_action(NEW_TAB))
    assert browser.driver.window_handles == [browser.driver.current_window_handle]
    assert res.terminated and res.reward == 1.0 and res.observation.url.endswith("/page2.html")


def test_scroll_double_click_and_keys_act_on_the_page(site, browser):
    spec = {"task_id": "local/long", "start_url": f"{site[1]}/long.html", "goal": "reach the end", "max_steps": 6,
            "evaluator": {"type": "js", "expression": "window.scrollY > 1000"}, "viewport": list(VIEWPORT)}
    env = make_env(spec, browser=browser)
    env.reset(0)
    res = env.step(format_action(Action("click", x=500, y=250, clicks=2)))
    assert env.run_js("return document.getElementById('dbl').textContent") == "double" and not res.done
    env.step(format_action(Action("type", x=100, y=566, text="one")))  # into #a (y = 150 + 20 px)
    env.step(format_action(Action("key", keys=("Tab",))))  # focus moves to #b
    assert env.run_js("return [document.activeElement.id, document.getElementById('a').value]") == ["b", "one"]
    res = env.step(format_action(Action("scroll", direction="down", amount=600)))
    assert not res.done and env.run_js("return window.scrollY") >= 500
    res = env.step(format_action(Action("scroll", x=500, y=500, direction="down", amount=1200)))
    assert res.terminated and res.reward == 1.0


def test_downloads_are_denied(site, browser):
    env = _env(site, browser, {"type": "js", "expression": "false"})
    env.reset(0)
    env.run_js("var a = document.createElement('a'); a.href = 'page2.html'; a.download = 'got-it.html';"
               "document.body.appendChild(a); a.click();")
    time.sleep(1.0)
    written = [name for _, _, files in os.walk(browser.profile_dir) for name in files if name.startswith("got-it")]
    assert written == [] and not os.path.exists(os.path.expanduser("~/Downloads/got-it.html"))
    assert env.step(format_action(Action("wait", seconds=0.0))).observation.url.endswith("/index.html")


def test_file_task_from_json_file_is_confined_to_its_folder(tmp_path, browser):
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "index.html").write_text(INDEX.replace("OUTSIDE", f"file://{tmp_path}"))  # links out of the folder
    (task_dir / "page2.html").write_text(PAGE2)
    (tmp_path / "secret.html").write_text("<p>secret</p>")
    spec = {"task_id": "file/test", "start_url": "index.html", "goal": "go to page 2", "max_steps": 4,
            "difficulty": "easy", "viewport": list(VIEWPORT),
            "evaluator": {"type": "text_match", "text": "Second page"}}
    path = task_dir / "task.json"
    path.write_text(json.dumps(spec))
    env = make_env(str(path), browser=browser)
    assert isinstance(env, WebTaskEnv) and env.max_steps == 4
    obs = env.reset(0)
    assert obs.url.startswith("file://") and obs.url.endswith("/index.html")
    assert f"file://{tmp_path}/tracker.png" in browser.request_guard.blocked  # a file:// subresource outside
    secret = "file://" + str(tmp_path / "secret.html")
    res = env.step(format_action(Action("navigate", text=secret)))
    assert "outside the task allowlist" in res.info["action_error"]
    res = env.step(format_action(AWAY))  # a file:// link out of the folder
    assert res.info["navigation_blocked"] == f"file://{tmp_path}/evil.html" and res.observation.url == obs.url
    res = env.step(format_action(NEXT))
    assert res.terminated and res.reward == 1.0
