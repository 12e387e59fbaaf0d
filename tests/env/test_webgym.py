"""WebGym task files read as they are: the fields, the rubric, difficulty -> horizon, held-out splits by task_id,
one-line refusals naming the line; in real Chromium the agent's answer ends the episode and is judged against the
ground truth."""

import json

import pytest

from jaxwebrl.env.agent.action_space import CLICK_GRID
from jaxwebrl.env.agent.actions import Action, parse_action
from jaxwebrl.env.agent.prompt import summarize_action
from jaxwebrl.env.browser.probes import serve_directory
from jaxwebrl.env.registry import action_texts, check_env_spec, env_specs, make_env, task_horizon
from jaxwebrl.env.tasks.webgym.judge import GroundTruthJudge, JudgeRequest, rubric_text
from jaxwebrl.env.tasks.webgym.webgym_tasks import HORIZONS, load_task_line
from jaxwebrl.env.tasks.webtask.task_spec import TaskSpecError


def task(n_facts=2, **fields):
    record = {"task_id": "t", "task_name": "Find the price of the red mug.", "website": "http://127.0.0.1:8000/",
              "domain": "shopping", "subdomain": "kitchen",
              "evaluator_reference": [f"fact {i}" if i % 2 else {"description": f"fact {i}"} for i in range(n_facts)],
              "reference_answer": "4.20"}
    record.update(fields)
    return {k: v for k, v in record.items() if v is not None}


def write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def test_a_line_is_read_as_webgym_writes_it_and_unknown_fields_are_kept(tmp_path):
    path = write(tmp_path / "tasks.jsonl", [task(5, task_id="a", annotator="x", extra_score=3)])
    loaded = load_task_line(path, 1)
    assert loaded.facts == tuple(f"fact {i}" for i in range(5)) and loaded.difficulty == "medium"
    assert (loaded.domain, loaded.subdomain, loaded.reference_answer) == ("shopping", "kitchen", "4.20")
    assert loaded.extra == {"annotator": "x", "extra_score": 3}
    spec = check_env_spec(f"webgym:{path}:1")
    assert (spec.task_id, spec.goal, spec.start_url, spec.max_steps) == ("a", loaded.task_name,
                                                                         "http://127.0.0.1:8000/", 20)
    assert spec.evaluator["type"] == "answer_match" and spec.evaluator["answer"] == "4.20"


@pytest.mark.parametrize("facts, difficulty, horizon", [(1, "easy", 10), (3, "easy", 10), (4, "medium", 20),
                                                         (6, "medium", 20), (7, "hard", 30), (12, "hard", 30)])
def test_difficulty_is_the_number_of_facts_and_sets_the_horizon(tmp_path, facts, difficulty, horizon):
    path = write(tmp_path / "t.jsonl", [task(facts)])
    assert load_task_line(path, 1).difficulty == difficulty and HORIZONS[difficulty] == horizon
    assert task_horizon(f"webgym:{path}:1", 50) == horizon and task_horizon(f"webgym:{path}:1", 5) == 5


def test_a_rubrics_fact_groups_and_fact_levels_reach_the_judge_as_webgym_gives_them(tmp_path):
    """WebGym's dict facts: {"description", "difficulty"} (the fact's own level, kept) and a fact group {"id",
    "description", "facts"}, each of whose facts the judge checks with its group's context, as WebGym's evaluator
    does; the group's facts count towards the difficulty."""
    rubric = [{"description": "The agent opened the shop", "difficulty": 1},
              {"id": "G2", "description": "The Red Mug page", "facts": ["was opened", "shows the price 4.20"]},
              {"id": 3, "description": "The answer", "facts": ["is 4.20", "names no other mug"]}]
    path = write(tmp_path / "t.jsonl", [task(evaluator_reference=rubric)])
    loaded = load_task_line(path, 1)
    assert loaded.facts == ("The agent opened the shop", "[Group G2: The Red Mug page] was opened",
                            "[Group G2: The Red Mug page] shows the price 4.20", "[Group 3: The answer] is 4.20",
                            "[Group 3: The answer] names no other mug")
    assert loaded.rubric == tuple(rubric) and loaded.difficulty == "medium"   # 5 facts
    asked = rubric_text(JudgeRequest("t", loaded.task_name, loaded.facts, "4.20"), 0)
    assert "\n3. [Group G2: The Red Mug page] shows the price 4.20\n" in asked


@pytest.mark.parametrize("level, difficulty", [(1, "easy"), (3, "easy"), (4, "medium"), (6, "medium"), (7, "hard"),
                                               (12, "hard")])
def test_an_integer_difficulty_is_webgyms_level_mapped_by_its_rule_and_kept(tmp_path, level, difficulty):
    """WebGym writes a task's difficulty as an integer level (the facts it was built with): 1-3 easy, 4-6 medium,
    7+ hard. The level decides, not the rubric's length (2 facts here), and the task keeps it."""
    path = write(tmp_path / "t.jsonl", [task(2, difficulty=level)])
    loaded = load_task_line(path, 1)
    assert (loaded.difficulty, loaded.difficulty_level) == (difficulty, level)
    assert task_horizon(f"webgym:{path}:1", 100) == HORIZONS[difficulty]


def test_a_lines_own_difficulty_wins(tmp_path):
    path = write(tmp_path / "t.jsonl", [task(1, difficulty="hard")])
    assert load_task_line(path, 1).difficulty == "hard" and task_horizon(f"webgym:{path}:1", 100) == 30


def test_held_out_split_by_difficulty_whatever_the_order(tmp_path):
    """One task in five of each difficulty held out (ceil(n/5)), the same whatever the file's order: 60 easy tasks
    hold out 12, one hard task is held out (a difficulty trained is a difficulty tested)."""
    records = [task(task_id=f"task-{i}") for i in range(60)] + [task(7, task_id="the-hard-one")]
    forward = write(tmp_path / "a.jsonl", records)
    backward = write(tmp_path / "b.jsonl", records[::-1])
    ids = {}
    for path in (forward, backward):
        for split in ("train", "test"):
            ids[path, split] = {check_env_spec(s).task_id for s in env_specs(f"webgym:{path}?split={split}")}
    assert ids[forward, "test"] == ids[backward, "test"] and ids[forward, "train"] == ids[backward, "train"]
    assert not ids[forward, "test"] & ids[forward, "train"]
    assert ids[forward, "test"] | ids[forward, "train"] == {r["task_id"] for r in records}
    assert len(ids[forward, "test"]) == 13 and "the-hard-one" in ids[forward, "test"]
    assert len(env_specs(f"webgym:{forward}")) == 61


@pytest.mark.parametrize("record, message", [
    (task(task_name=None), r"webgym task .*t\.jsonl:2 is missing \['task_name'\]"),
    (task(evaluator_reference=[]), r"t\.jsonl:2: 'evaluator_reference'=\[\]: must be a non-empty list"),
    (task(evaluator_reference=[{"text": "x"}]), r"t\.jsonl:2: 'evaluator_reference'.*\{\"description\""),
    (task(evaluator_reference=["a", {"description": "x", "weight": 2}]),
     r"t\.jsonl:2: 'evaluator_reference'.*: fact 2 has \['weight'\], which WebGym's facts do not carry: a fact is"),
    (task(evaluator_reference=[{"description": "x", "difficulty": 0}]), r"fact 1's difficulty=0: .*integer >= 1"),
    (task(evaluator_reference=[{"id": 1, "description": "g", "facts": []}]), r"fact 1's facts=\[\]: .*non-empty"),
    (task(evaluator_reference=[{"id": 1, "facts": ["ok", 3]}]), r"fact 1's facts=\['ok', 3\]: .*non-empty"),
    (task(evaluator_reference=[{"id": 1, "facts": ["ok"], "weight": 1}]), r"fact 1 has \['weight'\]"),
    (task(difficulty="extreme"), r"t\.jsonl:2: 'difficulty'='extreme': must be one of"),
    (task(difficulty=0), r"t\.jsonl:2: 'difficulty'=0: must be .*an integer level >= 1 \(1-3 easy"),
    (task(difficulty=-3), r"t\.jsonl:2: 'difficulty'=-3: must be .*an integer level >= 1"),
    (task(difficulty=2.5), r"t\.jsonl:2: 'difficulty'=2\.5: must be .*an integer level >= 1"),
    (task(difficulty=True), r"t\.jsonl:2: 'difficulty'=True: must be .*an integer level >= 1"),
    (task(ground_truth={"answer": "x", "mode": "fuzzy"}), r"t\.jsonl:2: 'ground_truth'"),
    (task(ground_truth={"answer": "X", "case_sensitive": True}), r"t\.jsonl:2: 'ground_truth'.*case_sensitive"),
    (task(website="ftp://x/"), r"t\.jsonl:2: 'start_url'='ftp://x/'"),
    (task(solution=[{"click": 5}, {"answer": "4.20"}]), r"t\.jsonl:2: 'solution'.*step 0 \{'click': 5\}"),
    (task(solution=[{"click": ["#a", "#b"]}, {"answer": "4.20"}]), r"t\.jsonl:2: 'solution'.*step 0"),
    (task(solution=[{"type": "#q"}, {"answer": "4.20"}]), r"t\.jsonl:2: 'solution'.*step 0"),
    (task(solution=[{"answer": 4.2}]), r"t\.jsonl:2: 'solution'.*step 0 \{'answer': 4\.2\}"),
])
def test_a_bad_line_is_refused_in_one_line_naming_its_number(tmp_path, record, message):
    path = write(tmp_path / "t.jsonl", [task(task_id="fine"), record])
    check_env_spec(f"webgym:{path}:1")
    with pytest.raises(TaskSpecError, match=message) as info:
        check_env_spec(f"webgym:{path}:2")
    assert "\n" not in str(info.value)


def test_a_rubric_alone_is_left_to_a_judge_and_refused_under_the_ground_truth_judge(tmp_path):
    """A line with no reference_answer and no ground_truth (many of WebGym's own) reads, plays with the evaluator
    {"type": "judge"}, and a run that would score it by the ground truth is refused at start-up in one line."""
    from jaxwebrl.train.config_validation import ConfigError, validate
    from tests.configs.test_recipes import load

    path = write(tmp_path / "t.jsonl", [task(task_id="answered"), task(task_id="rubric", reference_answer=None)])
    assert check_env_spec(f"webgym:{path}:1").evaluator["type"] == "answer_match"
    assert check_env_spec(f"webgym:{path}:2").evaluator == {"type": "judge", "when": "answer"}
    _, config = load("constT10")
    config.env.tasks = f"webgym:{path}"
    with pytest.raises(ConfigError, match=r"^env.judge.backend='ground_truth': 1 of the tasks \(first webgym:.*:2\) "
                                          r"have a rubric but no reference_answer or ground_truth: .*backend=chat"):
        validate(config, str(tmp_path / "run"))
    config.env.judge.update(backend="chat", url="http://127.0.0.1:9/v1", model="judge")
    validate(config, str(tmp_path / "run2"))


def test_a_blank_reference_answer_is_no_reference_answer(tmp_path):
    """A reference answer of spaces is none (like an empty one): the task is left to a judge, never matched
    against an empty answer."""
    path = write(tmp_path / "t.jsonl", [task(reference_answer="   "), task(reference_answer="")])
    for line in (1, 2):
        assert load_task_line(path, line).reference_answer is None
        assert check_env_spec(f"webgym:{path}:{line}").evaluator == {"type": "judge", "when": "answer"}


def test_a_task_id_used_twice_in_a_file_is_refused_naming_both_lines(tmp_path):
    path = write(tmp_path / "t.jsonl", [task(task_id="a"), task(task_id="b"), task(task_id="a")])
    with pytest.raises(TaskSpecError, match=r"t.jsonl:3: task_id 'a' is line 1's too"):
        env_specs(f"webgym:{path}")


def test_a_file_or_a_bad_option_is_not_one_task(tmp_path):
    path = write(tmp_path / "t.jsonl", [task()])
    with pytest.raises(TaskSpecError, match="one task per line"):
        check_env_spec(f"webgym:{path}")
    with pytest.raises(TaskSpecError, match="split='dev'"):
        env_specs(f"webgym:{path}?split=dev")
    with pytest.raises(TaskSpecError, match="use 'webgym:FILE.jsonl'"):
        env_specs(f"webgym:{path}?shuffle=1")


def test_the_prompt_carries_the_answer():
    assert summarize_action(Action("answer", text="4.20")) == "answer('4.20')"


@pytest.mark.browser
def test_the_answer_ends_the_episode_and_is_judged_by_the_ground_truth(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html><body><h1>Mugs</h1><p>Red mug: 4.20</p></body></html>")
    server, url, _ = serve_directory(str(site))
    try:
        path = write(tmp_path / "t.jsonl", [task(website=f"{url}/index.html", ground_truth={"answer": "4.20"})])
        env = make_env(f"webgym:{path}:1", screenshot_size=(128, 96), max_steps=50)
        try:
            for answer, reward in (("4.20", 1.0), ("  4.20 ", 1.0), ("5.00", 0.0)):
                obs = env.reset(0)
                assert obs.goal == "Find the price of the red mug." and env.max_steps == 10
                result = env.step(f'answer("{answer}")')
                assert result.terminated and result.reward == reward and result.info["success"] == (reward > 0)
        finally:
            env.close()
    finally:
        server.shutdown()
        server.server_close()


def test_a_constrained_policy_may_answer_each_tasks_reference_answer(tmp_path):
    path = write(tmp_path / "t.jsonl", [task(task_id="a"), task(task_id="b", reference_answer='say "hi"')])
    texts = action_texts(env_specs(f"webgym:{path}"))
    assert texts[:100] == CLICK_GRID and texts[100:] == ('answer("4.20")', 'answer("say \\"hi\\"")')
    assert [parse_action(t).text for t in texts[100:]] == ["4.20", 'say "hi"']


def test_a_regex_ground_truth_offers_the_answer_it_accepts_never_its_pattern(tmp_path):
    """A constrained policy's answer must be one the task's judge accepts: the reference answer the pattern
    matches, not the pattern itself (which the pattern rejects); with no answer to offer, clicks only."""
    path = write(tmp_path / "t.jsonl", [
        task(task_id="a", ground_truth={"answer": "^\\$?4\\.20$", "mode": "regex"}),
        task(task_id="b", ground_truth={"answer": "^5\\.\\d+$", "mode": "regex"}),      # 4.20 is not a 5.xx
        task(task_id="c", ground_truth={"answer": "4.2", "mode": "contains"})])
    specs = env_specs(f"webgym:{path}")
    offered = [[parse_action(t).text for t in action_texts([s]) if t.startswith("answer(")] for s in specs]
    assert offered == [["4.20"], [], ["4.2"]]
    judge = GroundTruthJudge()
    for spec, answers in zip(specs, offered):
        truth = load_task_line(path, int(spec.rpartition(":")[2])).ground_truth
        assert all(judge.judge(JudgeRequest("t", "g", ("f",), a, ground_truth=truth)).reward == 1.0 for a in answers)
