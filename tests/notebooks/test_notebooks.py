"""Every notebook under notebooks/ runs top to bottom on a fresh kernel without a cell error,
checks what it teaches, and has a current rendered copy under docs/notebooks/.

Each notebook executes with nbclient on the "python3" kernel (the Makefile installs the
venv's kernel under that name) in a temporary copy of notebooks/, so running the tests
never writes into the repository. The start notebook must also leave static PNG charts in
its saved outputs, so it reads well without a live kernel.

Each notebook asserts its lessons in code cells tagged "check" (source hidden in
JupyterLab): a claim that stops being true raises there, and the notebook's test fails.
The static tests below ask every notebook for such cells, each with an `assert`, and for a
rendered page (docs/notebooks/<name>.html, `make notebooks-html`) that records the hash of
the notebook's current cells.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
RENDERED = REPO / "docs" / "notebooks"
START = "00_start_here.ipynb"
PAGE_LIMIT_BYTES = 3_000_000  # a rendered page: outputs and PNG charts, no widget state


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


def _check_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and "check" in c.metadata.get("tags", [])]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_notebook_checks_what_it_teaches(path: Path) -> None:
    checks = _check_cells(nbformat.read(path, as_version=4))
    assert checks, f"{path.name}: no code cell tagged 'check' asserts its lessons"
    for cell in checks:
        assert re.search(r"^\s*assert\b", cell.source, re.MULTILINE), (
            f"{path.name}: the check cell {cell.get('id')} asserts nothing:\n{cell.source}"
        )


def _render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("notebook_render", RENDERED / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_rendered_page_is_current(path: Path) -> None:
    render = _render()
    page = render.page_for(path)
    assert page.is_file(), f"{page.relative_to(REPO)} is missing: run `make notebooks-html`"
    recorded = render.recorded(page)
    assert recorded.get(render.NAME_META) == path.name, recorded
    assert recorded.get(render.HASH_META) == render.source_hash(path), (
        f"{path.name} changed since {page.name} was rendered: run `make notebooks-html` "
        f"(or `python docs/notebooks/render.py {path.name}`)"
    )
    html = page.read_text(encoding="utf-8")
    assert page.stat().st_size < PAGE_LIMIT_BYTES, f"{page.name}: {page.stat().st_size:,} bytes"
    assert "application/vnd.jupyter.widget-state+json" not in html, "widget state embedded"
    assert "checked: " in html, f"{page.name} shows no check's output: was it executed?"
    assert "Traceback (most recent call last)" not in html
    for sheet in (render.SHARED_CSS, render.HEAD_CSS):
        if f'href="{sheet}"' in html:
            assert (RENDERED / sheet).is_file(), f"{page.name} links a missing {sheet}"


def test_every_rendered_page_has_its_notebook() -> None:
    names = {p.stem for p in _notebooks()}
    orphans = [p.name for p in RENDERED.glob("*.html") if p.stem not in names]
    assert not orphans, f"pages without a notebook (renamed or removed?): {orphans}"


def test_the_source_hash_sees_cells_not_outputs(tmp_path: Path) -> None:
    render = _render()
    path = tmp_path / START
    shutil.copy(NOTEBOOKS / START, path)
    before = render.source_hash(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
    code["execution_count"] = 7
    path.write_text(json.dumps(nb), encoding="utf-8")
    assert render.source_hash(path) == before  # executing a notebook does not change its hash
    code["source"] = ["# one changed line\n"] + list(code["source"])
    path.write_text(json.dumps(nb), encoding="utf-8")
    assert render.source_hash(path) != before


def test_library_noise_is_left_out_of_the_pages_and_the_rest_kept() -> None:
    render = _render()
    lesson = "workbench session 1: loss is nan at step 25: the step was not applied\n"
    noise = [
        "/usr/bin/ld: cannot find -laio: No such file or directory\n",
        "collect2: error: ld returned 1 exit status\n",
        "Failed to load /venv/site-packages/torchao/_C_mxfp8.so: Could not load this library: x\n",
        "USDT:2026-12-01 19:08:26 5242:5242 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    ]
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": "ld: cannot find -laio"},
            {
                "cell_type": "code",
                "outputs": [
                    {"output_type": "stream", "name": "stderr", "text": [*noise[:2]]},
                    {"output_type": "stream", "name": "stderr", "text": noise[2] + lesson},
                    {"output_type": "stream", "name": "stdout", "text": noise[3]},
                    {"output_type": "stream", "name": "stderr", "text": noise[3]},
                ],
            },
        ]
    }
    assert render.drop_library_noise(nb) == 4
    outputs = nb["cells"][1]["outputs"]
    assert outputs == [
        {"output_type": "stream", "name": "stderr", "text": lesson},
        {"output_type": "stream", "name": "stdout", "text": noise[3]},  # stdout is the lesson's
    ]
    assert nb["cells"][0]["source"] == "ld: cannot find -laio"


def test_the_profilers_transformers_and_deepspeeds_notices_are_left_out() -> None:
    """Notebook 06's page showed the profiler's notice of a block allocated before it
    started, transformers' note on GPT-2's unset loss_type (stderr) and DeepSpeed's
    accelerator notice, which its logger writes to stdout; the lesson's stdout stays."""
    render = _render()
    allocator = (
        "[W1205 13:31:39.014617104 CPUAllocator.cpp:245] Memory block of unknown size was "
        "allocated before the profiling started, profiler results will not include the "
        "deallocation event\n"
    )
    loss_type = (
        "[transformers] `loss_type=None` was set in the config but it is unrecognized. Using "
        "the default loss: `ForCausalLMLoss`.\n"
    )
    accelerator = (
        "[2026-12-05 13:32:01,496] [WARNING] [real_accelerator.py:213:get_accelerator] Setting "
        "accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.\n"
    )
    lesson = "peak 4.07 MiB:\n"
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "outputs": [
                    {"output_type": "stream", "name": "stderr", "text": allocator + loss_type},
                    {"output_type": "stream", "name": "stdout", "text": accelerator + lesson},
                    {"output_type": "stream", "name": "stdout", "text": allocator},
                ],
            }
        ]
    }
    assert render.drop_library_noise(nb) == 3
    assert nb["cells"][0]["outputs"] == [
        {"output_type": "stream", "name": "stdout", "text": lesson},
        {"output_type": "stream", "name": "stdout", "text": allocator},  # stderr's noise only
    ]


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_rendered_page_carries_no_library_noise(path: Path) -> None:
    render = _render()
    page = render.page_for(path)
    assert page.is_file(), f"{page.relative_to(REPO)} is missing: run `make notebooks-html`"
    html = page.read_text(encoding="utf-8")
    for block in re.findall(
        r'data-mime-type="application/vnd\.jupyter\.stderr"[^>]*>\s*<pre>(.*?)</pre>', html, re.S
    ):
        for line in re.sub(r"<[^>]+>", "", block).splitlines():
            line = line.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
            assert not any(p.match(line) for p in render.LIBRARY_NOISE), (page.name, line)


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.name)
def test_every_chart_is_drawn_into_the_page(path: Path) -> None:
    """Pages render under Agg, where `plt.show()` draws nothing: a chart is displayed as
    its PNG (each notebook's `show(fig)`), so the page holds one image per chart cell."""
    nb = nbformat.read(path, as_version=4)
    charts = [c for c in nb.cells if c.cell_type == "code" and "plt.subplots(" in c.source]
    for cell in charts:
        assert "plt.show()" not in cell.source, f"{path.name}: {cell.source[:200]}"
    page = _render().page_for(path)
    assert page.is_file(), f"{page.relative_to(REPO)} is missing: run `make notebooks-html`"
    assert page.read_text(encoding="utf-8").count("data:image/png;base64,") >= len(charts)
