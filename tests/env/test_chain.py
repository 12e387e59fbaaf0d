"""The chain family in real headless Chromium: the oracle (goal + screenshots only) solves every variant on held-out
seeds through the text action parser, a wrong press steps back, the link loops, a trap ends the episode as a
failure, the recall page shows no progress, misses run to the horizon, demonstrations stay on the click grid."""

import numpy as np
import pytest

from jaxwebrl.env.agent.action_space import CLICK_GRID, RESPONSE_PREFIX
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig
from jaxwebrl.env.registry import make_env, task_oracle
from jaxwebrl.env.tasks.chain.chain_tasks import COLOURS, SLOTS, chain_names, slot_centre, strip_cells
from jaxwebrl.env.tasks.miniwob.miniwob import VIEWPORT
from jaxwebrl.env.tasks.chain.oracle import chain_oracle
from jaxwebrl.env.tasks.episode import run_episode
from jaxwebrl.eval.demos import oracle_demonstrations
from jaxwebrl.eval.sft import won_episodes
from jaxwebrl.seeds import EVAL_SEED_START

pytestmark = pytest.mark.browser
HELD_OUT = range(EVAL_SEED_START, EVAL_SEED_START + 24)
SLOW_HELD_OUT = HELD_OUT[:12]   # the 20- and 30-step variants (the doctor in .ci/run plays every spec again)
FAST = ("chain/easy", "chain/easy-cue", "chain/easy-recall", "chain/medium-recall?trap=1")


@pytest.fixture(scope="module")
def browser():
    with Browser(BrowserConfig(viewport=VIEWPORT)) as b:
        yield b


def _env(spec, browser, size=(64, 64)):
    return make_env(spec, browser=browser, screenshot_size=size, max_steps=5)   # max_steps: the spec's own wins


@pytest.mark.parametrize("spec", [pytest.param(s, marks=() if s in FAST else pytest.mark.slow)
                                  for s in chain_names() + ["chain/medium-recall?trap=1", "chain/hard-recall?trap=2"]])
def test_the_oracle_solves_every_variant_on_held_out_seeds(browser, spec):
    env = _env(spec, browser)
    results = [run_episode(env, seed, task_oracle(spec)) for seed in (HELD_OUT if spec in FAST else SLOW_HELD_OUT)]
    wins = [r for r in results if r["success"]]
    assert len(wins) >= 0.95 * len(results), [(r["success"], r["steps"]) for r in results]
    assert {r["steps"] for r in wins} == {env.spec.presses} and all(r["invalid_actions"] == 0 for r in results)
    assert env.max_steps == env.spec.horizon and all(r["reward"] == 1.0 for r in wins)


def _slot_of(env, colour):
    return env.episode.layout().index(colour)


def _click(env, slot_or_point):
    x, y = slot_centre(slot_or_point) if isinstance(slot_or_point, int) else slot_or_point
    return env.step(f"click({x}, {y})")


def _strip_pixels(shot, presses):
    h, w = shot.shape[:2]
    return [tuple(shot[int((y0 + y1) / 2000 * h), int((x0 + x1) / 2000 * w)]) for x0, y0, x1, y1 in
            strip_cells(presses)]


def test_a_wrong_press_steps_back_and_the_link_loops_to_the_start(browser):
    env = _env("chain/medium", browser, size=None)
    env.reset(EVAL_SEED_START + 5)
    goal = [COLOURS[c] for c in env.episode.sequence]
    for i in range(2):
        result = _click(env, _slot_of(env, goal[i]))
        assert result.info["event"] == "advance" and result.info["progress"] == i + 1
    done = _strip_pixels(result.observation.screenshot, 5)
    wrong = next(c for c in COLOURS if c != goal[2])
    result = _click(env, _slot_of(env, wrong))
    assert (result.info["event"], result.info["progress"], result.done) == ("wrong", 1, False)
    after = _strip_pixels(result.observation.screenshot, 5)
    assert after[0] == done[0] and after[1] != done[1]   # the strip lost one press
    result = _click(env, (150, 950))                      # "back to start"
    assert (result.info["event"], result.info["progress"], result.reward) == ("back", 0, 0.0)
    assert result.info["action_error"] is None            # nothing tells the agent how far it got but the page
    result = _click(env, (950, 950))                      # empty page: nothing happens
    assert result.info["event"] == "miss" and result.observation.url.endswith("/chain.html")


def test_a_trap_ends_the_episode_as_a_failure(browser):
    env = _env("chain/hard?trap=1", browser)
    env.reset(3)
    _click(env, _slot_of(env, COLOURS[env.episode.sequence[0]]))
    result = _click(env, _slot_of(env, "trap"))
    assert result.terminated and not result.truncated and result.reward == 0.0
    assert result.info["event"] == "trap" and result.info["success"] is False and result.info["step"] == 2


def test_misses_run_to_the_horizon(browser):
    env = _env("chain/easy", browser)
    env.reset(0)
    results = [_click(env, (950, 950)) for _ in range(10)]
    assert [r.done for r in results] == [False] * 9 + [True]
    assert results[-1].truncated and not results[-1].terminated and results[-1].reward == 0.0


def test_the_recall_page_shows_no_progress(browser):
    strips = {}
    for spec in ("chain/hard", "chain/hard-recall"):
        env = _env(spec, browser, size=None)
        first = env.reset(11)
        shots = [first.screenshot]
        for i in range(3):
            shots.append(_click(env, _slot_of(env, COLOURS[env.episode.sequence[i]])).observation.screenshot)
        assert env.episode.progress == 3
        strips[spec] = [_strip_pixels(s, 7) for s in shots]
        top = [s[: s.shape[0] * 95 // 1000] for s in shots]   # the strip's band
        strips[spec + " band"] = all(np.array_equal(top[0], t) for t in top)
    assert len({tuple(s) for s in strips["chain/hard"]}) == 4   # one more dark cell each press
    assert strips["chain/hard-recall band"] and len({tuple(s) for s in strips["chain/hard-recall"]}) == 1


def test_the_oracle_reads_only_the_screenshot_and_goal(browser):
    env = _env("chain/medium-cue", browser)
    env.reset(EVAL_SEED_START)
    action = chain_oracle(env)
    env.last_screenshot = np.zeros_like(env.last_screenshot)   # a blank screen: nothing to press
    with pytest.raises(RuntimeError, match="not on the page"):
        chain_oracle(env)
    assert (action.x, action.y) in [slot_centre(s) for s in range(len(SLOTS))]


def test_demonstrations_of_each_variant_stay_on_the_click_grid():
    specs = ["chain/easy", "chain/easy-recall?layout=fixed&trap=1"]   # options out of their canonical order
    demos = oracle_demonstrations(specs, range(3), action_texts=CLICK_GRID, env_options={"screenshot_size": (64, 64)})
    assert len(demos) == 2 * 3 * 3
    assert all(d["response"].startswith(RESPONSE_PREFIX) and d["response"][len(RESPONSE_PREFIX):] in CLICK_GRID
               for d in demos)
    assert {d["task"] for d in demos} == {"chain/easy", "chain/easy-recall?trap=1&layout=fixed"}
    # the warm start's record counts each spec's won episodes as given (it counted 0 for such a spec)
    assert won_episodes(demos, specs) == {"chain/easy": 3, "chain/easy-recall?layout=fixed&trap=1": 3}


def test_free_memory_demonstrations_write_the_oracle_count_and_the_next_prompt_shows_it():
    from jaxwebrl.env.agent.action_space import MemoryGrammar
    from jaxwebrl.eval.sft import decision_rows, demo_rows
    from jaxwebrl.models.processor import tiny_processor
    from jaxwebrl.rollout.action_grammar import action_constraint

    grammar = MemoryGrammar()
    demos = oracle_demonstrations(["chain/easy-recall"], range(2), action_texts=CLICK_GRID, memory=grammar,
                                  env_options={"screenshot_size": (64, 64)})
    assert len(demos) == 2 * 3
    for d in demos:
        n = d["step"] + 1
        assert d["response"].startswith(f'Memory: {{"done": "{n}"}}\nAction: ')
        shown = d["messages"][-1]["content"][-1]["text"]
        assert shown.endswith("Memory: {}" if n == 1 else f'Memory: {{"done": "{n - 1}"}}')
    processor = tiny_processor()
    rows = demo_rows(demos, processor)
    constraint = action_constraint(processor, CLICK_GRID, processor.tokenizer.vocab_size, memory=grammar)
    for d, row, decided in zip(demos, rows, decision_rows(rows, constraint)):   # every demo is in the grammar
        response = processor.decode(row["input_ids"][row["loss_mask"] > 0])
        chosen = processor.decode(row["input_ids"][decided["loss_mask"] > 0])   # the choices: the key's letters
        assert str(d["step"] + 1) in chosen and len(chosen) < len(response) // 2   # that differ, the value, ...
