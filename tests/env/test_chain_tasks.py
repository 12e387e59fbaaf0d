"""The chain family without a browser: specs and their options, the held-out goal split, the episode's rules
(advance, step back, loop, trap, success), the variants' progress strips, and the grids the grammar offers."""

import pytest

from jaxwebrl.env.agent.action_space import CLICK_GRID, click_grid
from jaxwebrl.env import families, registry
from jaxwebrl.env.registry import action_texts, check_env_spec, needs_browser, shares_browser, task_horizon
from jaxwebrl.env.tasks.chain import chain_tasks
from jaxwebrl.env.tasks.chain.chain_tasks import (COLOUR_RGB, COLOURS, DONE_RGB, SLOTS, TODO_RGB, ChainEpisode,
                                            goal_sequence, held_out_sequence, parse_chain_spec, slot_centre)
from jaxwebrl.env.tasks.miniwob.miniwob_tasks import miniwob_options
from jaxwebrl.seeds import EVAL_SEED_START


def test_splits_have_the_papers_horizons_and_short_successes():
    got = {split: (parse_chain_spec(f"chain/{split}").horizon, parse_chain_spec(f"chain/{split}").presses)
           for split in ("easy", "medium", "hard")}
    assert got == {"easy": (10, 3), "medium": (20, 5), "hard": (30, 7)}
    spec = parse_chain_spec("chain/medium-recall?trap=1&horizon=40")
    assert (spec.split, spec.variant, spec.traps, spec.horizon, spec.difficulty) == ("medium", "recall", 1, 40,
                                                                                     "medium")
    assert spec.name == "chain/medium-recall?trap=1&horizon=40"
    assert parse_chain_spec("chain/hard?trap=0&horizon=30").name == "chain/hard"   # defaults left out


@pytest.mark.parametrize("spec, message", [
    ("chain/impossible", "unknown chain spec .chain/impossible.: use one of chain/easy, chain/easy-cue"),
    ("chain/easy?traps=1", "unknown option 'traps'"),
    ("chain/easy?trap=3", "at most|use 0..2"),
    ("chain/easy?trap=-1", "non-negative integer"),
    ("chain/hard?horizon=6", "horizon=6: must be in 7..1000"),
    ("chain/easy?trap", "options must look like trap=1&horizon=40"),
    ("toy?x=1", "takes no options"),
    ("miniwob/choose-date?reward=lenient", "reward=binary | strict | raw"),
])
def test_bad_specs_fail_before_anything_starts_with_the_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        check_env_spec(spec)


def test_chain_specs_are_registered_browser_envs_on_the_click_grid():
    specs = ["chain/easy", "chain/hard-recall?trap=1", "chain/medium-cue"]
    assert all(check_env_spec(s) == s for s in specs)
    assert families.family_of("chain/hard-recall?trap=1").name == "chain"
    assert task_horizon("chain/hard-recall?trap=1", 5) == 30 and not shares_browser("chain/easy")   # its own horizon
    assert needs_browser(["toy", "chain/easy"]) and not needs_browser(["toy"])
    assert action_texts(specs) == CLICK_GRID
    assert all(f"click({x}, {y})" in CLICK_GRID for x, y in map(slot_centre, range(len(SLOTS))))
    assert all(f"click({x}, 950)" in CLICK_GRID for x in range(50, 351, 100))   # the back link's row


def test_declared_grids_follow_into_the_grammar():
    assert click_grid(10, 10) == CLICK_GRID and len(click_grid(20, 20)) == 400
    assert action_texts(["miniwob/click-test"]) == CLICK_GRID
    both = action_texts(["miniwob/click-test", "miniwob/choose-date?reward=strict"])
    assert both[:100] == CLICK_GRID and set(both[100:]) == set(click_grid(20, 20)) - set(CLICK_GRID)
    assert miniwob_options("reward=strict") == {"reward": "strict"} and miniwob_options("") == {}


def test_held_out_seeds_play_goals_training_seeds_never_see():
    distinct = {}
    for presses in (3, 5, 7):
        train = {goal_sequence(presses, s) for s in range(400)}
        held = {goal_sequence(presses, EVAL_SEED_START + s) for s in range(100)}
        assert train.isdisjoint(held) and len(held) >= 10   # easy: 10 of its 36 goals are held out
        assert all(held_out_sequence(g) for g in held) and not any(held_out_sequence(g) for g in train)
        assert all(g[i] != g[i + 1] for g in train | held for i in range(presses - 1))
        distinct[presses] = len(held)
    # the browser power study's eval (docs/learning.md): 100 instances a task, 300 episodes over >= 100 goals
    assert distinct == {3: 10, 5: 50, 7: 90}
    assert goal_sequence(5, 12) == goal_sequence(5, 12)


def _press_colour(episode: ChainEpisode, colour: str) -> str:
    return episode.press(episode.layout().index(colour))


def test_a_correct_press_advances_a_wrong_one_steps_back_the_link_loops():
    episode = ChainEpisode(parse_chain_spec("chain/medium"), seed=4)
    goal = [COLOURS[c] for c in episode.sequence]
    assert episode.goal == "Press " + ", ".join(goal) + "."
    assert [_press_colour(episode, goal[i]) for i in range(2)] == ["advance", "advance"]
    wrong = next(c for c in COLOURS if c != goal[2])
    assert _press_colour(episode, wrong) == "wrong" and episode.progress == 1
    assert episode.press(None) == "miss" and episode.progress == 1
    assert episode.press("back") == "back" and episode.progress == 0
    assert _press_colour(episode, wrong if wrong != goal[0] else goal[1]) == "wrong" and episode.progress == 0
    events = [_press_colour(episode, goal[i]) for i in range(5)]
    assert events == ["advance"] * 4 + ["success"] and episode.over and episode.page == 11


def test_a_trap_ends_the_episode_and_pages_are_shuffled():
    episode = ChainEpisode(parse_chain_spec("chain/easy?trap=2"), seed=1)
    layouts = set()
    for _ in range(6):
        layout = episode.layout()
        assert sorted(str(x) for x in layout) == sorted(COLOURS + ("trap", "trap"))
        layouts.add(layout)
        episode.press(None)
    assert len(layouts) >= 4   # a new shuffle nearly every page
    first_pages = {ChainEpisode(parse_chain_spec("chain/easy?trap=2"), seed=s).layout() for s in range(6)}
    assert len(first_pages) >= 4   # and per seed
    assert episode.press(episode.layout().index("trap")) == "trap" and episode.over and episode.progress == 0


def test_the_recall_strip_shows_no_progress_the_cue_strip_names_the_next_colour():
    strips = {}
    for variant in ("", "-cue", "-recall"):
        episode = ChainEpisode(parse_chain_spec(f"chain/easy{variant}"), seed=3)
        _press_colour(episode, COLOURS[episode.sequence[0]])
        strips[variant] = episode.strip()
    next_rgb = COLOUR_RGB[COLOURS[ChainEpisode(parse_chain_spec("chain/easy"), 3).sequence[1]]]
    assert strips[""] == [DONE_RGB, TODO_RGB, TODO_RGB]
    assert strips["-cue"] == [DONE_RGB, next_rgb, TODO_RGB]
    assert strips["-recall"] == [TODO_RGB] * 3


def test_a_registered_env_gets_the_options_its_spec_names():
    class Fake:
        def __init__(self, **options):
            self.options = options

    def parse(query):
        key, _, value = query.partition("=")
        if key != "level" or not value.isdigit():
            raise ValueError(f"bad option {query!r}: use level=N")
        return {"level": int(value)}

    registry.register_env("test-options", Fake, options=parse)
    try:
        env = registry.make_env("test-options?level=3", max_steps=4, browser=object())
        assert env.options == {"max_steps": 4, "level": 3}   # no browser: the entry does not take one
        assert registry.make_env("test-options", max_steps=4).options == {"max_steps": 4}
        with pytest.raises(ValueError, match="bad option 'lvl=3': use level=N"):
            check_env_spec("test-options?lvl=3")
    finally:
        families._FAMILIES.pop("test-options")
    with pytest.raises(ValueError, match="without commas, '\\?'"):
        registry.register_env("bad?name", Fake)


def test_the_fixed_layout_keeps_every_colour_in_its_place_on_every_page():
    spec = parse_chain_spec("chain/hard-recall?trap=2&layout=fixed")
    assert spec.layout == "fixed" and spec.name == "chain/hard-recall?trap=2&layout=fixed"
    episode = ChainEpisode(spec, seed=5)
    pages = set()
    for press in range(6):
        pages.add(episode.layout())
        episode.press(press % 4)
    assert pages == {("red", "green", "blue", "yellow", "trap", "trap")}
    shuffled, seen = ChainEpisode(parse_chain_spec("chain/hard"), seed=5), set()
    for _ in range(6):
        seen.add(shuffled.layout())
        shuffled.press(None)                         # a miss turns the page
    assert len(seen) > 1                             # the default draws every page's layout
    with pytest.raises(ValueError, match="layout='grid': use one of shuffled, fixed"):
        parse_chain_spec("chain/easy?layout=grid")
