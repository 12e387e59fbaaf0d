"""bench/provenance.py: a device measurement names the commit and the JAX build it ran on."""

import subprocess

from bench.provenance import commit_of, provenance


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_commit_is_the_checkouts_head_and_says_when_tracked_files_differ(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert commit_of(str(repo)) == head
    (repo / "a.txt").write_text("two\n")
    assert commit_of(str(repo)) == head + "+dirty"


def test_a_tree_without_git_takes_the_commit_from_the_environment(tmp_path, monkeypatch):
    bare = tmp_path / "copy"            # the device machine receives the tree without its .git
    bare.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setenv("JAXWEBRL_COMMIT", "abc1234")
    assert commit_of(str(bare)) == "abc1234"
    monkeypatch.delenv("JAXWEBRL_COMMIT")
    assert commit_of(str(bare)) is None


def test_provenance_records_the_build_and_the_flags(monkeypatch):
    import jax

    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    record = provenance()
    assert record["jax"] == jax.__version__ and record["backend"] == jax.default_backend()
    assert record["xla_flags"] == "--xla_dump_to=/tmp/x"
    assert record["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.9"
    assert record["cudnn"] is None or record["cudnn"] > 0   # None on the CPU
    assert record["commit"] and len(record["commit"].split("+")[0]) == 40
