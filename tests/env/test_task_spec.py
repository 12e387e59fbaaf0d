"""JSON task specs are validated completely before any browser starts: every case of the issue (viewport [0, 10]
and [100000, 100000], max_steps 1e18, unknown keys, a start URL outside its own allowlist, a bad regex,
os.system as evaluator, ints and nulls), one-line errors naming the file, the key and the fix, and a python
evaluator named but imported only when a worker builds the env. The run's config validation uses the same
check."""

import json
import os

import pytest

from jaxwebrl.env.tasks.webtask import task_spec
from jaxwebrl.env.registry import check_env_spec
from jaxwebrl.env.tasks.webtask.task_spec import TaskSpecError, WebTaskSpec, load_function, load_spec_file

GOOD = {"task_id": "shop/find", "start_url": "http://127.0.0.1:8000/index.html", "goal": "find it",
        "evaluator": {"type": "js", "expression": "true"}}


@pytest.mark.parametrize("patch, key, fix", [
    ({"viewport": [0, 10]}, "viewport", "each side an int in 64..4096 px"),
    ({"viewport": [100000, 100000]}, "viewport", "each side an int in 64..4096 px"),
    ({"viewport": None}, "viewport", "[width, height]"),
    ({"viewport": [1024.0, 768]}, "viewport", "[width, height]"),
    ({"max_steps": 10**18}, "max_steps", "an int in 1..1000"),
    ({"max_steps": 1e18}, "max_steps", "an int in 1..1000"),
    ({"max_steps": True}, "max_steps", "an int in 1..1000"),
    ({"max_steps": 0}, "max_steps", "an int in 1..1000"),
    ({"colour": "red"}, "colour", "unknown key; the keys are"),
    ({"task_id": 5}, "task_id", "non-empty string"),
    ({"goal": None}, "goal", "non-empty string"),
    ({"goal": ""}, "goal", "non-empty string"),
    ({"start_url": 42}, "start_url", "non-empty string"),
    ({"start_url": "ftp://example.org/"}, "start_url", "http(s):// or file://"),
    ({"start_url": "http://127.0.0.1:port/"}, "start_url", "port must be a number"),
    ({"difficulty": "extreme"}, "difficulty", "one of"),
    ({"allowlist": None}, "allowlist", "list of at most 256 URL patterns"),
    ({"allowlist": "http://x/*"}, "allowlist", "list of at most 256 URL patterns"),
    ({"allowlist": [5]}, "allowlist", "list of at most 256 URL patterns"),
    ({"allowlist": ["127.0.0.1:8000/*"]}, "allowlist", "not a URL pattern"),
    ({"allowlist": ["http://127.0.0.1:9000/*"]}, "start_url", "outside the task's own allowlist"),
    ({"allowlist": ["http://*.example.com/*"]}, "start_url", "outside the task's own allowlist"),
])
def test_bad_fields_are_one_line_naming_key_and_fix(patch, key, fix):
    with pytest.raises(TaskSpecError) as err:
        WebTaskSpec.from_dict({**GOOD, **patch})
    message = str(err.value)
    source = "shop/find" if key != "task_id" else "(inline)"  # a spec is named by its task_id while it has one
    assert message.startswith(f"task spec {source}: {key!r}="), message
    assert fix in message and "\n" not in message, message


def test_missing_keys_are_listed():
    with pytest.raises(TaskSpecError, match=r"^task spec t is missing \['goal'\]; required: "):
        WebTaskSpec.from_dict({"task_id": "t", "start_url": "http://127.0.0.1:1/", "evaluator": {"type": "js",
                                                                                                "expression": "1"}})
    with pytest.raises(TaskSpecError, match="must be a JSON object, got list"):
        WebTaskSpec.from_dict([GOOD])


@pytest.mark.parametrize("evaluator, fix", [
    (None, "must be an object with type in"),
    ({"type": "vibes"}, "must be an object with type in"),
    ({"type": "js"}, "needs ['expression']"),
    ({"type": "js", "expression": 7}, "'expression'=7 must be a non-empty string"),
    ({"type": "js", "expression": "1", "extra": 1}, "unknown keys ['extra']"),
    ({"type": "url_match", "pattern": "(", "mode": "regex"}, "is not a valid regex"),
    ({"type": "text_match", "text": "[a-", "mode": "regex"}, "is not a valid regex"),
    ({"type": "answer_match", "answer": "*x", "mode": "regex", "case_sensitive": True}, "is not a valid regex"),
    ({"type": "url_match", "pattern": "x", "mode": "fuzzy"}, "must be one of"),
    ({"type": "text_match", "text": "x", "case_sensitive": "yes"}, "must be true or false"),
    ({"type": "text_match", "text": "x", "selector": 5}, "CSS selector string"),
    ({"type": "js", "expression": "1", "when": 3}, "'step' or 'answer'"),
    ({"type": "python", "function": "os.system"}, "standard library (os) are refused"),
    ({"type": "python", "function": "os:system"}, "standard library (os) are refused"),
    ({"type": "python", "function": "subprocess.run"}, "standard library (subprocess) are refused"),
    ({"type": "python", "function": "builtins.eval"}, "standard library (builtins) are refused"),
    ({"type": "python", "function": "numpy._private"}, "private names are refused"),
    ({"type": "python", "function": "pkg.mod:Class.method"}, "must name a function"),
    ({"type": "python", "function": "eval"}, "must name a function"),
    ({"type": "python", "function": "no_such_package_xyz.fn"}, "no package 'no_such_package_xyz'"),
    ({"type": "python", "function": "numpy.sum", "args": "x"}, "'args'='x' must be a JSON object"),
])
def test_bad_evaluators_are_named(evaluator, fix):
    with pytest.raises(TaskSpecError, match="^task spec shop/find: 'evaluator': ") as err:
        WebTaskSpec.from_dict({**GOOD, "evaluator": evaluator})
    assert fix in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_python_evaluator_is_imported_by_the_worker_not_by_validation(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "side_effect_evals.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from os import system\n"
        "def solved(ctx):\n    return True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = WebTaskSpec.from_dict({**GOOD, "evaluator": {"type": "python", "function": "side_effect_evals.solved"}})
    assert spec.evaluator["function"] == "side_effect_evals.solved" and not marker.exists()
    assert load_function("side_effect_evals.solved")(None) is True and marker.exists()  # the worker's import
    with pytest.raises(ValueError, match="must be a Python function defined in 'side_effect_evals' .*from posix"):
        load_function("side_effect_evals.system")  # os.system re-exported by a module of one's own: refused


def test_spec_files_are_named_in_every_error(tmp_path):
    path = tmp_path / "task.json"
    path.write_text(json.dumps({**GOOD, "viewport": [0, 10]}))
    with pytest.raises(TaskSpecError, match=f"^task spec {path}: 'viewport'=\\[0, 10\\]: must be"):
        load_spec_file(str(path))
    path.write_text('{"task_id": "x",')
    with pytest.raises(TaskSpecError, match=f"^task spec {path}: not valid JSON .*: fix the file$"):
        load_spec_file(str(path))
    with pytest.raises(TaskSpecError, match="cannot read it"):
        load_spec_file(str(tmp_path / "missing.json"))
    (tmp_path / "index.html").write_text("<p>task</p>")
    path.write_text(json.dumps({**GOOD, "start_url": "index.html"}))  # relative: resolved against the file
    assert load_spec_file(str(path)).start_url == f"file://{tmp_path}/index.html"
    assert isinstance(check_env_spec(str(path)), WebTaskSpec) and check_env_spec("toy") == "toy"


def test_the_run_config_validates_task_specs_before_any_browser(tmp_path):
    """The issue: a bad spec passed validation (only the file's existence was checked), then workers restarted."""
    from jaxwebrl.train.config_validation import ConfigError, validate
    from tests.configs.test_recipes import load

    _, config = load("constT10")
    for patch, key in (({"viewport": [0, 10]}, "viewport"), ({"colour": 1}, "colour"),
                       ({"allowlist": ["http://127.0.0.1:9/*"]}, "start_url")):
        path = tmp_path / "task.json"
        path.write_text(json.dumps({**GOOD, **patch}))
        config.env.tasks = str(path)
        with pytest.raises(ConfigError, match=f"^env.tasks: task spec {path}: '{key}'=") as err:
            validate(config, str(tmp_path))
        assert "\n" not in str(err.value) and "browser" not in str(err.value)
    path.write_text(json.dumps(GOOD))
    validate(config, str(tmp_path))


def test_limits_are_the_documented_ones():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "env.md")) as f:
        doc = f.read()
    assert f"1..{task_spec.MAX_STEPS}" in doc and "{}..{}".format(*task_spec.VIEWPORT_RANGE) in doc
