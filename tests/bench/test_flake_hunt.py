"""bench/flake_hunt.sh: each run of the hunted tests is one JSON line naming its commit, the bench digest, its
counts and the tests that failed; a tree with uncommitted changes is refused before anything runs."""

import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "flake_hunt.sh")


def git(tree, *args):
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


def hunt_tree(tmp_path):
    """A committed checkout whose 'hunted' file holds one passing test (1.5 s of CPU) and one failing test."""
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_hunted.py").write_text("import time\n\n"
                                                   "def test_ok():\n    start = time.process_time()\n"
                                                   "    while time.process_time() - start < 1.5:\n        pass\n\n"
                                                   "def test_bad():\n    assert False, 'a race'\n")
    git(tree, "init", "-q")
    git(tree, "add", ".")
    git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "hunted")
    return tree


def hunt(tree, record, runs="2", **env):
    env = dict(os.environ, RECORD=str(record), TESTS="tests/test_hunted.py", BESIDE="a test", NICE="0", **env)
    return subprocess.run(["bash", SCRIPT, str(tree), runs], capture_output=True, text=True, timeout=300, env=env)


def test_each_run_is_a_record_line_with_its_counts_and_failures(tmp_path):
    tree, record = hunt_tree(tmp_path), tmp_path / "hunt.jsonl"
    done = hunt(tree, record)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert len(lines) == 2
    for line in lines:
        assert line["commit"] == head and len(line["bench_digest"]) == 8
        assert line["counts"] == {"tests": 2, "failures": 1, "errors": 0, "skipped": 0}
        assert line["failed"] == ["tests.test_hunted::test_bad"] and line["rc"] == 1 and not line["timed_out"]
        assert "a test" in line["beside"] and "yes" in line["beside"]
        assert line["cpu_s"] >= 1.5   # the tests' processes' CPU seconds (test_ok spins 1.5 s), not the shell's


def test_a_tree_with_uncommitted_changes_is_refused_and_nothing_recorded(tmp_path):
    tree, record = hunt_tree(tmp_path), tmp_path / "hunt.jsonl"
    (tree / "tests" / "test_hunted.py").write_text("def test_ok():\n    pass\n")
    done = hunt(tree, record, runs="1")
    assert done.returncode == 2 and "uncommitted changes" in done.stderr
    assert not record.exists()


def test_a_run_stopped_by_its_timeout_keeps_the_failures_it_had_shown(tmp_path):
    """No report is written when the timeout kills pytest: the line keeps its progress, so a failure seen before
    the timeout is not lost in a timed-out run."""
    tree, record = hunt_tree(tmp_path), tmp_path / "hunt.jsonl"
    (tree / "tests" / "test_hunted.py").write_text(
        (tree / "tests" / "test_hunted.py").read_text() + "\n\ndef test_slow():\n    import time\n    time.sleep(120)\n")
    git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "slow")
    done = hunt(tree, record, runs="1", TIMEOUT_S="20")
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(line) for line in record.read_text().splitlines()]
    assert line["timed_out"] and line["counts"] is None and line["failed"] == []
    assert line["before_timeout"] == {"progress": ".F", "passed": 1, "failures": 1, "errors": 0}


def test_the_digest_follows_the_launch_flags_the_bench_tests_import_and_no_other_test(tmp_path):
    """The bench tests take SMALL and ONE_GROUP from tests/launch/test_train_run.py: a change there is a change of
    the hunted tests (a new digest), a change to any other test outside tests/bench is not."""
    tree, record = hunt_tree(tmp_path), tmp_path / "hunt.jsonl"
    (tree / "tests" / "launch").mkdir()
    (tree / "tests" / "launch" / "test_train_run.py").write_text('ONE_GROUP = "--config.train.length_groups=1"\n')
    (tree / "tests" / "test_other.py").write_text("def test_other():\n    pass\n")
    git(tree, "add", ".")
    digests = []
    for change in (None, "tests/test_other.py", "tests/launch/test_train_run.py"):
        if change:
            with open(tree / change, "a") as f:
                f.write("# changed\n")
        git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", f"change {change}")
        assert hunt(tree, record, runs="1").returncode == 0
        digests.append(json.loads(record.read_text().splitlines()[-1])["bench_digest"])
    assert digests[0] == digests[1] != digests[2]
