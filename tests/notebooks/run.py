"""Execute the notebooks headless (nbclient), as the suite does, and keep their outputs in the committed files.

    python -m tests.notebooks.run          # re-execute notebooks/*.ipynb from notebooks/ and save the outputs

The committed notebooks carry their executed outputs (they read on GitHub and in Colab without running); the
tests execute a copy and compare its printed text with the committed one, so a stale output fails.
"""

from __future__ import annotations

import os
import pathlib
import sys

import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ("loss_analysis.ipynb", "training_curves.ipynb", "lab_study.ipynb", "browser_power.ipynb")


def execute(name: str, *, cwd: pathlib.Path, env: dict[str, str] | None = None):
    """The notebook `notebooks/<name>` executed in a fresh python3 kernel whose working directory is `cwd`
    (jaxwebrl imported from this checkout); `env` adds environment variables for the kernel."""
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    saved = dict(os.environ)
    os.environ.update({"PYTHONPATH": os.pathsep.join([str(REPO), saved.get("PYTHONPATH", "")]),
                       "JAX_PLATFORMS": "cpu", **(env or {})})
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def printed(nb) -> list[str]:
    """Each code cell's printed text (stream outputs), in order: what must not drift from the committed file."""
    return ["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream")
            for c in nb.cells if c.cell_type == "code"]


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def main() -> int:
    for name in NOTEBOOKS:
        nb = execute(name, cwd=REPO / "notebooks",
                     env={"JAXWEBRL_WORKDIR": "", "JAXWEBRL_LAB_RECORDS": "", "JAXWEBRL_POWER_RECORDS": ""})
        nbformat.write(nb, REPO / "notebooks" / name)
        print(f"notebooks/{name}: executed, {images(nb)} plots saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
