"""Execute notebooks/training_curves.ipynb headless on the small recorded toy run in tests/data/toy_run: from the
repository root with $JAXWEBRL_WORKDIR, and from notebooks/ (Jupyter's working directory) with nothing set; the
committed notebook carries the same printed outputs and its plots."""

import nbformat

from tests.notebooks.run import REPO, execute, images, printed

NAME = "training_curves.ipynb"


def _check(nb):
    assert images(nb) >= 1, "the notebook must draw its plots"
    text = "".join(printed(nb))
    assert "tests/data/toy_run: 30 train steps, evals:" in text and "last train step" in text
    assert "step   0: success" in text


def test_training_curves_notebook_executes_from_the_repository_root():
    nb = execute(NAME, cwd=REPO, env={"JAXWEBRL_WORKDIR": str(REPO / "tests" / "data" / "toy_run")})
    _check(nb)


def test_training_curves_notebook_executes_from_its_own_folder_and_matches_the_committed_outputs():
    nb = execute(NAME, cwd=REPO / "notebooks", env={"JAXWEBRL_WORKDIR": ""})
    _check(nb)
    committed = nbformat.read(REPO / "notebooks" / NAME, as_version=4)
    _check(committed)
    assert printed(committed) == printed(nb), "stale outputs: run `python -m tests.notebooks.run` and commit"
