"""docs/quickstart.ipynb runs top to bottom in a real Jupyter kernel."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_quickstart_notebook_runs(tmp_path):
    notebook = nbformat.read(DOCS / "quickstart.ipynb", as_version=4)
    # Run from a copy of docs/ so the outputs land in tmp_path, next to the examples.
    shutil.copytree(DOCS.parent / "examples", tmp_path / "examples")
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", []) if o.output_type == "error"]
    assert not errors
    printed = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    assert "Answer:" in printed
    assert "Speaker's emotion, Chain of Empathy:" in printed and "Style Disentangler:" in printed
    assert (tmp_path / "quickstart_output" / "response.mp4").is_file()
    assert (tmp_path / "quickstart_output" / "index.html").is_file()
