"""Task sets: a .jsonl file (one JSON task spec per line) and a directory of .json / .jsonl spec files, wherever
env.tasks is read (env_specs, config validation, evaluation with real workers in Chromium); a bad line is one
error line naming FILE:LINE."""

import json

import pytest

from jaxwebrl.env.registry import check_env_spec, env_specs
from jaxwebrl.env.tasks.webtask.task_spec import TaskSpecError, WebTaskSpec
from jaxwebrl.train.config_validation import ConfigError, validate
from tests.configs.test_recipes import load

PAGE = """<!doctype html><html><body style="margin:0">
<button style="position:absolute;left:0;top:0;width:100%;height:100%"
  onclick="document.body.dataset.done='1'">{label}</button></body></html>"""


def _spec(task_id, **patch):
    return {"task_id": task_id, "start_url": "page.html", "goal": f"press the button ({task_id})", "max_steps": 2,
            "evaluator": {"type": "js", "expression": "document.body.dataset.done === '1'"}, **patch}


@pytest.fixture
def task_dir(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "page.html").write_text(PAGE.format(label="Press"))
    lines = [json.dumps(_spec("set/a")), "", json.dumps(_spec("set/b", difficulty="easy")), "  "]
    (folder / "more.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "a_single.json").write_text(json.dumps(_spec("set/single")))
    (folder / "notes.txt").write_text("not a spec")
    return folder


def test_jsonl_expands_to_one_spec_per_line_resolved_against_its_folder(task_dir):
    path = str(task_dir / "more.jsonl")
    assert env_specs(f"toy,{path}") == ["toy", f"{path}:1", f"{path}:3"]
    spec = check_env_spec(f"{path}:3")
    assert isinstance(spec, WebTaskSpec) and spec.task_id == "set/b" and spec.difficulty == "easy"
    assert spec.start_url == f"file://{task_dir}/page.html"


def test_directory_expands_to_its_spec_files_sorted(task_dir):
    jsonl = str(task_dir / "more.jsonl")
    assert env_specs(str(task_dir)) == [str(task_dir / "a_single.json"), f"{jsonl}:1", f"{jsonl}:3"]
    assert [check_env_spec(s).task_id for s in env_specs(str(task_dir))] == ["set/single", "set/a", "set/b"]


def test_bad_lines_are_one_line_errors_naming_file_and_line(task_dir, tmp_path):
    _, config = load("constT10")
    path = task_dir / "more.jsonl"
    cases = [('{"task_id": "x",', "3", "not valid JSON .*one JSON object per line"),
             (json.dumps(_spec("set/c", viewport=[0, 10])), "3", "'viewport'=\\[0, 10\\]: must be"),
             ("[1, 2]", "3", "must be a JSON object")]
    for bad, line, fix in cases:
        path.write_text("\n".join([json.dumps(_spec("set/a")), "", bad]) + "\n")
        config.env.tasks = str(task_dir)
        with pytest.raises(ConfigError, match=f"^env.tasks: task spec {path}:{line}:? {fix}") as err:
            validate(config, str(tmp_path / "run"))
        assert "\n" not in str(err.value)
    with pytest.raises(TaskSpecError, match=f"^task spec {path}:9: no task spec on that line"):
        check_env_spec(f"{path}:9")
    with pytest.raises(ValueError, match="one spec per line: list it in env.tasks"):
        check_env_spec(str(path))


def test_missing_set_and_empty_directory_are_one_line(tmp_path):
    _, config = load("constT10")
    for tasks, message in ((str(tmp_path / "nope.jsonl"), "cannot read it .*one task spec per line"),
                           (str(tmp_path), "no .json or .jsonl task spec files in it")):
        config.env.tasks = tasks
        with pytest.raises(ConfigError, match=f"^env.tasks: task set {tasks}: {message}") as err:
            validate(config, str(tmp_path / "run"))
        assert "\n" not in str(err.value)


@pytest.mark.browser
def test_evaluation_plays_a_task_set_directory_in_chromium(task_dir, tmp_path):
    from jaxwebrl.eval.evaluate import evaluate
    from jaxwebrl.models.processor import tiny_processor
    from jaxwebrl.rollout.scripted import ScriptedBackend, random_choice_responder
    from tests.eval.trained import toy_config

    config = toy_config()
    config.model.max_new_tokens = 64
    press = "Action: click(500, 500)"     # the button covers the page: the first click wins

    def handler(buffer):
        return ScriptedBackend(random_choice_responder([press], write_memory=False), processor=tiny_processor(),
                               fetch_image=buffer.screenshots.get)

    report = evaluate(config, None, tasks=[str(task_dir)], seeds=[1], out_dir=str(tmp_path / "eval"),
                      make_handler=handler)
    assert sorted(report["tasks"]) == ["set/a", "set/b", "set/single"]
    assert report["overall"]["success_rate"] == 1.0 and report["overall"]["env_failed"] == 0
    assert report["tasks"]["set/b"]["split"] == "easy"
