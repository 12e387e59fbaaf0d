"""The browser layer: crash and hang -> catchable EnvFailure then a working restart, no orphan processes,
non-root sandboxed Chromium when run as root, allowlist matching, install hints."""

import os
import signal
import time

import psutil
import pytest

from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.base import BrowserCrashed, EnvFailure, EnvTimeout
from jaxwebrl.env.browser.allowlist import UrlAllowlist
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig, check_installation
from jaxwebrl.env.browser.keys import key_events
from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT, MiniWobEnv
from jaxwebrl.env.registry import task_oracle
from jaxwebrl.env.tasks.episode import run_episode


def _gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def test_allowlist_matching():
    allow = UrlAllowlist(["http://127.0.0.1:8000/*", "https://example.org/docs/", "http://exact.test/a.html"])
    assert allow.allows("http://127.0.0.1:8000/index.html#frag")
    assert allow.allows("HTTP://127.0.0.1:8000/a/b?q=1")
    assert not allow.allows("http://127.0.0.1:8001/index.html")
    assert allow.allows("https://example.org/docs/page") and not allow.allows("https://example.org/admin")
    assert allow.allows("http://exact.test/a.html") and not allow.allows("http://exact.test/b.html")
    assert allow.allows("about:blank") and not allow.allows("data:text/html,hi")
    files = UrlAllowlist.for_directory("/tasks/shop")
    assert files.allows("file:///tasks/shop/index.html")
    assert not files.allows("file:///tasks/shop/../secret.html")
    assert not files.allows("file:///tasks/shopping/index.html")
    assert not files.allows("file:///etc/passwd")
    with pytest.raises(TypeError):
        UrlAllowlist("http://x/*")


def test_key_chords_become_cdp_key_events():
    events = key_events(["ctrl", "a"])
    assert [(e["type"], e["key"], e["modifiers"]) for e in events] == [
        ("rawKeyDown", "Control", 2), ("rawKeyDown", "a", 2), ("keyUp", "a", 2), ("keyUp", "Control", 0)]
    assert events[1]["text"] == ""  # a ctrl chord types nothing
    enter = key_events(["Enter"])
    assert enter[0]["type"] == "keyDown" and enter[0]["text"] == "\r" and enter[0]["windowsVirtualKeyCode"] == 13
    assert key_events(["shift", "b"])[1]["text"] == "B"
    assert key_events(["F5"])[0]["windowsVirtualKeyCode"] == 116
    with pytest.raises(ValueError, match="unknown key 'Hyper'"):
        key_events(["Hyper"])


def test_missing_browser_says_how_to_install(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install -y chromium chromium-driver"):
        check_installation(BrowserConfig(chromium_path=str(tmp_path / "nope")))
    with pytest.raises(FileNotFoundError, match="chromedriver not found"):
        Browser(BrowserConfig(chromedriver_path=str(tmp_path / "nope")))


@pytest.mark.browser
def test_killed_chromium_raises_env_failure_and_reset_restarts():
    env = MiniWobEnv("click-test")
    try:
        env.reset(0)
        pids = env.browser.process_ids()
        assert len(pids) >= 2
        if os.geteuid() == 0:
            users = {psutil.Process(p).username() for p in pids}
            assert users == {"nobody"}, users
        if env.browser.sandboxed:  # Chromium's own report agrees (this machine allows the sandbox as nobody)
            env.browser.driver.get("chrome://sandbox")
            report = env.browser.run_js("return document.body.innerText")
            assert "You are adequately sandboxed" in report, report
        else:
            assert "sandbox" in env.browser.sandbox_note
        os.kill(env.browser.chromium_pid(), signal.SIGKILL)
        with pytest.raises(EnvFailure) as caught:
            for _ in range(3):  # the first command may race the dying process
                env.step(format_action(Action("click", x=500, y=500)))
        assert isinstance(caught.value, (BrowserCrashed, EnvTimeout))
        assert not env.browser.alive
        # the next reset starts a fresh browser and the task is playable again
        assert run_episode(env, 1, task_oracle(env.task_id))["success"]
        assert _gone(pids), "processes of the crashed browser are still running"
    finally:
        env.close()


@pytest.mark.browser
def test_hung_page_times_out_and_close_leaves_no_process():
    browser = Browser(BrowserConfig(viewport=VIEWPORT, command_timeout_s=4.0, unthrottled_frames=True))
    pids = browser.process_ids()
    flags = psutil.Process(browser.chromium_pid()).cmdline()
    assert "--disable-frame-rate-limit" in flags and "--disable-background-networking" in flags
    assert any(f.startswith("--user-data-dir=") for f in flags)
    try:
        with pytest.raises(EnvTimeout):
            browser.run_js("while (true) {}")
        assert not browser.alive
        with pytest.raises(BrowserCrashed, match="not running"):
            browser.screenshot()
        browser.restart()
        assert browser.alive and browser.run_js("return 1 + 1") == 2
        assert _gone(pids)
        pids = browser.process_ids()
        profile_dir = browser.profile_dir
        assert os.path.isdir(os.path.join(profile_dir, "profile"))
    finally:
        browser.close()
        browser.close()  # idempotent
    assert _gone(pids), "close() left Chromium processes behind"
    assert not os.path.exists(profile_dir), "the fresh profile outlived its browser"
