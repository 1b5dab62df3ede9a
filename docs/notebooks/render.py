"""Render every notebook of notebooks/ executed, as HTML here (`make notebooks-html`).

Each notebook runs top to bottom on a fresh "python3" kernel in a temporary copy of
notebooks/ (as tests/notebooks/test_notebooks.py runs it, so nothing is written into the
repository), then becomes `<name>.html` beside this file with nbconvert's lab template.
Widget state is not stored, so a page holds the outputs and charts, not a widget model;
the template's stylesheets go once into lab.css and head.css here, which every page links.

Library noise is left out of the pages (`drop_library_noise`): lines other libraries
write to stderr that say nothing about the lesson, such as the linker's `cannot find -laio`
when DeepSpeed probes for libaio while it builds an op (notebook 04), torchao's `Failed to
load` of CUDA kernels a CPU machine lacks (notebook 06), the profiler's kineto start/stop
lines and its notice of a block allocated before it started, torch's pytree registration
notices and transformers' note on GPT-2's unset `loss_type`; and the one line DeepSpeed's
logger writes to stdout when it finds no GPU (`LIBRARY_STDOUT_NOISE`: every other stdout
line is the lesson's). The notebook itself runs unchanged.

Each page records its notebook's name and the SHA-256 of its cells' types and sources in
two <meta> tags; tests/notebooks/test_notebooks.py fails when a notebook's cells changed
and its page was not rendered again.

    python docs/notebooks/render.py                       # every notebook
    python docs/notebooks/render.py 03_gradient_accumulation.ipynb
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NOTEBOOKS = REPO / "notebooks"
HASH_META = "workbench-notebook-source-sha256"
NAME_META = "workbench-notebook"
TIMEOUT_SECONDS = 600  # per cell
SHARED_CSS = "lab.css"
HEAD_CSS = "head.css"  # the template's other head styles, also the same in every page
LAB_CSS = ("static/index.css", "static/theme-light.css")  # what the lab template inlines


#: stderr lines of other libraries that say nothing about the lesson (see the docstring)
LIBRARY_NOISE = (
    re.compile(r"^(/usr/bin/)?ld: cannot find -laio\b.*$"),
    re.compile(r"^collect2: error: ld returned 1 exit status$"),
    re.compile(r"^Failed to load .*torchao.*: Could not load this library: .*$"),
    re.compile(r"^USDT:.*\] profiler_(start|stop)$"),
    re.compile(r"^W\d{4} [\d:.]+ \d+ .*_pytree\.py:\d+\] <enum '\w+'> is an Enum subclass.*$"),
    re.compile(
        r"^\[W\d{4} [\d:.]+ CPUAllocator\.cpp:\d+\] Memory block of unknown size was "
        r"allocated before the profiling started, profiler results will not include the "
        r"deallocation event$"
    ),
    re.compile(
        r"^\[transformers\] `loss_type=None` was set in the config but it is unrecognized\. "
        r"Using the default loss: `\w+`\.$"
    ),
)

#: the lines of other libraries' loggers that write to stdout (see the docstring)
LIBRARY_STDOUT_NOISE = (
    re.compile(
        r"^\[[\d\- :,]+\] \[WARNING\] \[real_accelerator\.py:\d+:get_accelerator\] Setting "
        r"accelerator to CPU\. If you have GPU or other accelerator, we were unable to detect "
        r"it\.$"
    ),
)


def drop_library_noise(nb: Any) -> int:
    """Removes the `LIBRARY_NOISE` lines from the stderr outputs of `nb`'s code cells and
    the `LIBRARY_STDOUT_NOISE` lines from their stdout outputs (an output left empty goes);
    returns how many lines were removed."""
    removed = 0
    streams = {"stderr": LIBRARY_NOISE, "stdout": LIBRARY_STDOUT_NOISE}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        kept_outputs = []
        for out in cell.get("outputs", []):
            noise = streams.get(out.get("name")) if out.get("output_type") == "stream" else None
            if noise:
                text = out.get("text", "")
                text = "".join(text) if isinstance(text, list) else text
                lines = text.splitlines(keepends=True)
                kept = [ln for ln in lines if not any(p.match(ln.rstrip("\n")) for p in noise)]
                removed += len(lines) - len(kept)
                if not kept:
                    continue
                out["text"] = "".join(kept)
            kept_outputs.append(out)
        cell["outputs"] = kept_outputs
    return removed


def notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def source_hash(path: Path) -> str:
    """SHA-256 of the notebook's cells (type and source, in order); outputs do not count."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    text = [
        [c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]]
        for c in cells
    ]
    return hashlib.sha256(json.dumps(text, ensure_ascii=False).encode("utf-8")).hexdigest()


def recorded(page: Path) -> dict[str, str]:
    """The name and hash a rendered page records ({} when it records none)."""
    found = re.findall(
        r'<meta name="(workbench-notebook[^"]*)" content="([^"]*)">',
        page.read_text(encoding="utf-8"),
    )
    return dict(found)


def page_for(path: Path) -> Path:
    return HERE / (path.stem + ".html")


def render(path: Path) -> Path:
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "MPLBACKEND": "Agg",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this environment
    try:
        with tempfile.TemporaryDirectory(prefix="workbench-render-") as workdir:
            copy = Path(workdir) / path.name
            shutil.copy(path, copy)
            nb = nbformat.read(copy, as_version=4)
            NotebookClient(
                nb,
                kernel_name="python3",
                timeout=TIMEOUT_SECONDS,
                startup_timeout=120,
                store_widget_state=False,
                resources={"metadata": {"path": workdir}},
            ).execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    drop_library_noise(nb)
    exporter = HTMLExporter(template_name="lab")
    html, _ = exporter.from_notebook_node(nb)
    html = _link_shared_css(html, exporter)
    meta = (
        f'<meta name="{NAME_META}" content="{path.name}">\n'
        f'<meta name="{HASH_META}" content="{source_hash(path)}">\n'
    )
    head = html.index("<head>") + len("<head>")
    page = page_for(path)
    page.write_text(html[:head] + "\n" + meta + html[head:], encoding="utf-8")
    return page


def _link_shared_css(html: str, exporter: Any) -> str:
    """The lab template's stylesheets (about 260 kB, the same in every page) written once to
    `SHARED_CSS` beside the pages, each page linking it instead of holding a copy."""
    env = exporter.environment
    blocks = [
        f'<style type="text/css">\n{env.loader.get_source(env, name)[0]}</style>'
        for name in LAB_CSS
    ]
    if not all(block in html for block in blocks):
        return html  # another template version: keep its styles inline
    (HERE / SHARED_CSS).write_text(
        "\n".join(b[len('<style type="text/css">\n') : -len("</style>")] for b in blocks),
        encoding="utf-8",
    )
    for block in blocks[1:]:
        html = html.replace(block, "", 1)
    html = html.replace(blocks[0], f'<link rel="stylesheet" href="{SHARED_CSS}">', 1)
    # the template's other head styles (code highlighting, widgets, mermaid): the same in
    # every page too, so one more shared file
    end = html.index("</head>")
    head_styles = re.findall(r"<style[^>]*>(.*?)</style>", html[:end], flags=re.S)
    if head_styles:
        (HERE / HEAD_CSS).write_text("\n".join(head_styles), encoding="utf-8")
        head = re.sub(r"<style[^>]*>.*?</style>\s*", "", html[:end], flags=re.S)
        html = head + f'<link rel="stylesheet" href="{HEAD_CSS}">\n' + html[end:]
    return html


def main(argv: list[str]) -> int:
    chosen = [NOTEBOOKS / name for name in argv] or notebooks()
    missing = [str(p) for p in chosen if not p.is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    from nbclient.exceptions import CellExecutionError

    failed = []
    for path in chosen:
        started = time.perf_counter()
        try:
            page = render(path)
        except CellExecutionError as exc:  # a cell raised: report it, render the others
            print(f"{path.name}: not rendered, a cell failed:\n{exc}", file=sys.stderr)
            failed.append(path.name)
            continue
        seconds = time.perf_counter() - started
        size_kb = page.stat().st_size / 1e3
        print(
            f"{path.name} -> {page.relative_to(REPO)}: {seconds:.0f} s, {size_kb:.0f} kB",
            flush=True,
        )
    if failed:
        print(f"not rendered: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
