"""bench/provenance.py: a device measurement names the commit and the JAX build it ran on; a browser run names the
Chromium and the CPU."""

import subprocess

import pytest

from bench.provenance import browser_version, commit_of, cpu_model, provenance
from jaxwebrl.env.browser.browser import Browser
from jaxwebrl.env.browser.chromium import BrowserConfig


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


@pytest.mark.browser
def test_the_browser_version_is_the_one_webdriver_drives(tmp_path):
    with Browser(BrowserConfig()) as browser:
        driven = browser.driver.capabilities["browserVersion"]
    assert browser_version(BrowserConfig().chromium_path) == driven
    assert browser_version(str(tmp_path / "no-chromium")) is None


def test_the_cpu_is_named_with_its_widest_vector_extension(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse4_2 avx avx2\n\n"
                   "processor\t: 1\nmodel name\t: another\nflags\t\t: fpu avx512f\n")
    assert cpu_model(str(x86)) == "Intel(R) Xeon(R) Processor (avx2)"      # the first processor's
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd\nCPU part\t: 0xd0c\n")
    assert cpu_model(str(arm)) == "0xd0c" and cpu_model(str(tmp_path / "none")) is None
