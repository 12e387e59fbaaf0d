"""Execute notebooks/loss_analysis.ipynb headless so it cannot rot (its asserts are part of this test), from the
repository root and from notebooks/; the committed notebook carries the same printed outputs and its plots."""

import nbformat
import pytest

from tests.notebooks.run import REPO, execute, images, printed

NAME = "loss_analysis.ipynb"


@pytest.mark.parametrize("cwd", ["repository root", "notebooks"])
def test_loss_analysis_notebook_executes(cwd):
    nb = execute(NAME, cwd=REPO if cwd == "repository root" else REPO / "notebooks")
    assert images(nb) >= 2, "the notebook must draw its plots"
    assert "1/|tau|" in "".join(printed(nb))
    committed = nbformat.read(REPO / "notebooks" / NAME, as_version=4)
    assert images(committed) >= 2 and all(c.execution_count for c in committed.cells if c.cell_type == "code")
    assert printed(committed) == printed(nb), "stale outputs: run `python -m tests.notebooks.run` and commit"
