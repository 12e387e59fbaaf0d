"""Execute notebooks/lab_study.ipynb headless on the lab study's committed records (docs/results/lab): it draws
every ratio's curves and prints the verdict table of bench/lab_table.py; the committed notebook carries the same
printed outputs (a new record means re-running `python -m tests.notebooks.run`)."""

import subprocess
import sys

import nbformat

from tests.notebooks.run import REPO, execute, images, printed

NAME = "lab_study.ipynb"


def test_lab_notebook_draws_the_records_and_prints_the_verdicts_of_bench_lab_table():
    nb = execute(NAME, cwd=REPO / "notebooks", env={"JAXWEBRL_LAB_RECORDS": ""})
    assert images(nb) >= 1, "the notebook must draw its curves"
    text = "".join(printed(nb))
    table = subprocess.run([sys.executable, str(REPO / "bench" / "lab_table.py")], capture_output=True, text=True,
                           check=True).stdout
    assert table.strip() in text, "the notebook's verdicts are not bench/lab_table.py's"
    assert "ratio 2.5: constT10 (50 seeds x 200 updates), grpo (50 seeds x 200 updates)" in text
    committed = nbformat.read(REPO / "notebooks" / NAME, as_version=4)
    assert images(committed) >= 1
    assert printed(committed) == printed(nb), "stale outputs: run `python -m tests.notebooks.run` and commit"
