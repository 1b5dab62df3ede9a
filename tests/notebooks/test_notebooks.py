"""Every notebook under notebooks/ runs top to bottom on a fresh kernel without a cell error.

Each notebook executes with nbclient on the "python3" kernel (the Makefile installs the
venv's kernel under that name) in a temporary copy of notebooks/, so running the tests
never writes into the repository. The start notebook must also leave static PNG charts in
its saved outputs, so it reads well without a live kernel.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
START = "00_start_here.ipynb"


def _notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_start_notebook_exists() -> None:
    names = [p.name for p in _notebooks()]
    assert START in names, f"notebooks/{START} is missing; found {names}"


def _execute(path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    # The kernel inherits this environment: import workbench from this checkout, draw with Agg.
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("MPLBACKEND", "Agg")
    copy = workdir / path.name
    shutil.copy(path, copy)
    nb = nbformat.read(copy, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=300,
        startup_timeout=120,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError naming the cell on the first error
    nbformat.write(nb, copy)
    return nb


def _outputs(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_notebook_runs_without_errors(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nb = _execute(path, tmp_path, monkeypatch)
    errors = [out for out in _outputs(nb) if out.output_type == "error"]
    assert not errors, f"{path.name}: " + "; ".join(f"{e.ename}: {e.evalue}" for e in errors)
    streams = "".join(out.get("text", "") for out in _outputs(nb) if out.output_type == "stream")
    assert "Traceback (most recent call last)" not in streams, streams[-2000:]
    if path.name == START:
        _check_static_charts(nb)


def _check_static_charts(nb: nbformat.NotebookNode) -> None:
    """The saved start notebook carries the panels' charts as PNG, next to the widgets."""
    pngs = [
        base64.b64decode(out.data["image/png"])
        for out in _outputs(nb)
        if out.output_type in ("display_data", "execute_result")
        and "image/png" in out.get("data", {})
    ]
    assert pngs, "executing the start notebook produced no image/png output"
    for png in pngs:
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), "image/png output is not a PNG"
        assert len(png) > 2000, "image/png output is too small to hold a chart"
    widget_views = [
        out
        for out in _outputs(nb)
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    ]
    assert widget_views, "the start notebook shows no widgets"
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    assert state.get("state"), "the executed notebook holds no widget state"
