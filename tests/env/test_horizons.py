"""Per-task horizons: a task's own horizon wins below env.max_episode_steps, which caps every task (docs/env.md)."""

from jaxwebrl.buffer.from_config import create_sized
from jaxwebrl.env.registry import make_env, run_horizon, task_horizon
from jaxwebrl.rollout.spec import worker_fields
from tests.configs.test_recipes import load


def spec(max_steps):
    return {"task_id": f"local/h{max_steps}", "start_url": "http://127.0.0.1:9/index.html", "goal": "g",
            "max_steps": max_steps, "evaluator": {"type": "url_match", "pattern": "done"}}


def test_a_specs_own_max_steps_wins_below_the_cap_and_the_cap_bounds_it():
    assert task_horizon(spec(3), 5) == 3            # issue 32.7: 5 once overrode the spec's 3
    assert task_horizon(spec(30), 5) == 5
    assert task_horizon("miniwob/click-tab", 30) == 5          # easy split
    assert task_horizon("miniwob/book-flight", 30) == 20       # hard split
    assert task_horizon("miniwob/book-flight", 7) == 7
    assert task_horizon("toy", 4) == 3                          # a fixed-horizon registered env plays its own
    assert task_horizon("chain/hard-recall", 5) == 30           # ... whatever the cap (it takes none)
    assert task_horizon("chain/medium?trap=1&horizon=25", 30) == 25
    assert task_horizon("miniwob/click-checkboxes-large?reward=strict", 30) == 20   # the query keeps its split
    assert run_horizon([spec(3), "miniwob/book-flight", spec(12)], 30) == 20


def test_the_worker_spec_builds_envs_with_each_tasks_own_horizon():
    config = load("constT10", "tiny")[1]
    config.env.max_episode_steps = 5
    options = worker_fields(config)["env_options"]
    env = make_env(spec(3), **options)      # what a worker builds: no browser starts until reset
    try:
        assert env.max_steps == 3
    finally:
        env.close()
    assert make_env(spec(30), **options).max_steps == 5


def test_a_buffer_sized_per_episode_holds_the_longest_horizon(tmp_path):
    config = load("constT10", "tiny")[1]
    config.env.max_episode_steps = 30
    buffer = create_sized(config, str(tmp_path / "b"), 4, run_horizon([spec(3), spec(25)], 30))
    assert buffer.config.capacity_steps == 4 * 25 + 16
