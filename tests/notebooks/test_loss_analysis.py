"""Execute notebooks/loss_analysis.ipynb headless so it cannot rot (its asserts are part of this test)."""

import os
import pathlib

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_loss_analysis_notebook_executes(monkeypatch):
    path = REPO / "notebooks" / "loss_analysis.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    # the kernel subprocess imports jaxwebrl from this checkout
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "the notebook must draw its plots"
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "1/|tau|" in text
