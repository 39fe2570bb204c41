"""Every notebook in notebooks/ executes clean in a fresh kernel, and shows figures.

The kernel is this interpreter (``sys.executable``: the venv in CI), declared in a kernelspec
written to a temporary JUPYTER_PATH for the test, so a user-level ``python3`` kernel pointing at
some other Python can never be picked up. The committed notebook must also carry its executed
outputs, figures included (people read it on GitHub without running it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
KERNEL = "cbsim-test-python"


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "cbsim tests",
        "language": "python",
    }))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root))
    mp.setenv("JUPYTER_PLATFORM_DIRS", "1")
    yield KERNEL
    mp.undo()


def images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


def errors(nb) -> list[str]:
    return [f"{out.get('ename')}: {out.get('evalue')}" for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/*.ipynb is empty"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_carries_its_figures(path):
    nb = nbformat.read(path, as_version=4)
    assert not errors(nb), f"{path.name} was saved with errors: {errors(nb)}"
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} was saved with unexecuted cells: run it top to bottom and save"
    assert images(nb) >= 1, f"{path.name} was saved without figure outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_clean(path, kernel_name):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=300, allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any exception
    assert not errors(nb)
    assert images(nb) >= 1, f"{path.name} produced no image/png output"
    stderr = [out.get("text", "") for cell in nb.cells if cell.cell_type == "code"
              for out in cell.outputs if out.get("name") == "stderr"]
    assert not any("Warning" in t or "Traceback" in t for t in stderr), f"{path.name} wrote warnings: {stderr}"
