"""MiniWoB++ in real headless Chromium: oracles solve the tasks through the text action parser, resets are
seeded and never time out, rewards come from the page, invalid actions are counted, not fatal."""

import pytest

from configs.base import FIELDS
from jaxwebrl.env.agent.actions import Action, format_action
from jaxwebrl.env.registry import make_env, task_oracle
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.browser.memory_bound import MB, PROCESS_BOUND, bound_browser_memory
from jaxwebrl.env.tasks.miniwob.miniwob import MAX_EPISODE_TIME_MS, VIEWPORT, MiniWobEnv
from jaxwebrl.env.tasks.miniwob.miniwob_tasks import SPLITS, available_tasks, horizon
from jaxwebrl.env.tasks.episode import run_episode
from jaxwebrl.env.tasks.miniwob.oracles import get_oracle, oracle_tasks, oracle_text

pytestmark = pytest.mark.browser
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def browser():
    with Browser(BrowserConfig(viewport=VIEWPORT)) as b:
        yield b


def test_oracles_cover_at_least_ten_tasks():
    tasks = oracle_tasks()
    assert len(tasks) >= 10
    required = {"click-test", "click-button", "click-link", "click-dialog", "click-tab", "click-option",
                "click-checkboxes", "focus-text", "enter-text", "login-user"}
    assert required <= set(tasks)
    assert set(tasks) <= set(available_tasks())
    with pytest.raises(KeyError, match="no oracle"):
        get_oracle("book-flight")


def test_oracles_solve_ninety_percent_of_episodes(browser):
    """... under the default bound of a worker's browsers (env.browser_memory_mb), which the tasks never trip and
    which holds four such browsers (a worker's max_open_envs) with room to spare."""
    bound_mb, breaches = FIELDS["env.browser_memory_mb"].default, PROCESS_BOUND.breaches
    outcomes = {}
    for task in oracle_tasks():
        env = MiniWobEnv(task, browser=browser)
        bound_browser_memory(env, bound_mb)
        outcomes[task] = [run_episode(env, seed, task_oracle(env.task_id)) for seed in SEEDS]
    held, = [n for b, n in PROCESS_BOUND.usage() if b is browser]
    assert PROCESS_BOUND.breaches == breaches and 0 < 4 * held < bound_mb * MB, held / MB
    episodes = [r for results in outcomes.values() for r in results]
    solved = sum(r["success"] for r in episodes)
    assert solved >= 0.9 * len(episodes), {t: [r["success"] for r in rs] for t, rs in outcomes.items()}
    for task, results in outcomes.items():
        assert sum(r["success"] for r in results) >= 2, (task, results)
        assert all(r["invalid_actions"] == 0 and r["reward"] in (0.0, 1.0) for r in results)
    # multi-step tasks really took several steps through the parser
    assert min(r["steps"] for r in outcomes["login-user"]) == 3


def test_reset_is_seeded_and_disables_the_page_timer(browser):
    env = MiniWobEnv("login-user", browser=browser)
    first = env.reset(7)
    other = env.reset(8)
    again = env.reset(7)
    assert first.goal == again.goal != other.goal
    assert (first.screenshot == again.screenshot).all()
    assert first.screenshot.shape == (210, 160, 3) and first.screenshot.dtype.name == "uint8"
    assert first.url.endswith("/miniwob/login-user.html")
    max_time, timer_running = env.run_js("return [core.EPISODE_MAX_TIME, core.EP_TIMER !== null];")
    assert max_time == MAX_EPISODE_TIME_MS and timer_running


def test_wrong_action_gives_zero_reward_and_raw_mode_keeps_minus_one(browser):
    for mode, expected in (("binary", 0.0), ("raw", -1.0)):
        env = MiniWobEnv("click-test-2", browser=browser, reward=mode)
        env.reset(3)
        x, y = env.element_point("#subbtn2")  # the wrong button
        res = env.step(format_action(Action("click", x=x, y=y)))
        assert res.terminated and res.reward == expected and not res.info["success"]
        assert res.info["raw_reward"] == -1.0


def test_invalid_actions_are_counted_and_the_horizon_truncates(browser):
    env = MiniWobEnv("click-test", browser=browser, max_steps=2, screenshot_size=(64, 84))
    obs = env.reset(0)
    assert obs.screenshot.shape == (84, 64, 3)
    res = env.step("I would like to click the button please")
    assert res.info["invalid_action"] and "no action" in res.info["action_error"]
    assert not res.done and res.reward == 0.0
    res = env.step('{"action": "click", "coordinate": [5000, 1]}')
    assert res.info["invalid_action"] and res.truncated and not res.terminated
    with pytest.raises(RuntimeError, match="reset"):
        env.step("click(1, 1)")


def test_a_page_the_agent_went_back_to_is_never_judged_and_the_task_page_returns(browser):
    """A worker's MiniWoB++ envs share a browser: `go_back` from click-dialog loaded the click-test page played
    before, where clicking its START cover and button won the click-dialog episode (reward 1.0)."""
    played_before, env = MiniWobEnv("click-test", browser=browser), MiniWobEnv("click-dialog", browser=browser)
    played_before.reset(0)
    first = env.reset(0)
    res = env.step(format_action(Action("go_back")))
    assert browser.current_url() == first.url and res.observation.url == first.url
    assert "left the task page" in res.info["action_error"] and not res.done and res.reward == 0.0
    assert (res.observation.screenshot == first.screenshot).all()   # the same instance, restarted
    assert env.run_js("return [core.EP_TIMER !== null, core.getUtterance()];") == [True, first.goal]


def test_answer_ends_the_episode_and_keys_edit_text(browser):
    env = MiniWobEnv("enter-text", browser=browser)
    env.reset(4)
    res = env.step(format_action(Action("answer", text="done")))
    assert res.terminated and res.reward == 0.0
    # a pre-filled wrong value: the oracle must select it with ctrl+a and type over it
    env.reset(4)
    env.run_js("document.getElementById('tt').value = 'wrong';")
    texts = []
    while True:
        texts.append(oracle_text(env))
        res = env.step(texts[-1])
        if res.done:
            break
    assert res.reward == 1.0
    assert any('"keys": ["ctrl", "a"]' in t for t in texts)


def test_a_key_whose_capital_is_two_letters_is_typed_not_an_env_crash(browser):
    """key("ß"): "ß".upper() is "SS", and ord() of it raised TypeError out of env.step (an env failure)."""
    env = MiniWobEnv("enter-text", browser=browser)
    env.reset(4)
    x, y = env.element_point("#tt")
    env.step(format_action(Action("click", x=x, y=y)))
    for key in ("ß", "é", "ﬁ"):
        res = env.step(format_action(Action("key", keys=(key,))))
        assert res.info["action_error"] is None and not res.done
    assert env.run_js("return document.getElementById('tt').value;") == "ßéﬁ"


def test_make_env_dispatch_and_splits():
    assert horizon("click-test") == SPLITS["easy"][0] and horizon("book-flight") == SPLITS["hard"][0]
    assert horizon("not-in-a-split") == 10
    for _, tasks in SPLITS.values():
        assert set(tasks) <= set(available_tasks())
    with pytest.raises(ValueError, match="unknown MiniWoB"):
        make_env("miniwob/click-tset")
    env = make_env("miniwob/click-tab", max_steps=3)
    assert isinstance(env, MiniWobEnv) and env.task_id == "miniwob/click-tab" and env.max_steps == 3
    env.close()  # never started a browser: closing is still fine
