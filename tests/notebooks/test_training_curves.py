"""Execute notebooks/training_curves.ipynb headless on the small recorded toy run in tests/data/toy_run."""

import os
import pathlib

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_training_curves_notebook_executes(monkeypatch):
    nb = nbformat.read(REPO / "notebooks" / "training_curves.ipynb", as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("JAXWEBRL_WORKDIR", str(REPO / "tests" / "data" / "toy_run"))
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1, "the notebook must draw its plots"
    text = "".join(o.get("text", "") for o in outputs)
    assert "train steps, evals:" in text and "last train step" in text and "step   0: success" in text
