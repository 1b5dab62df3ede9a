"""Re-running a notebook cell that shows panels closes the panels its previous run made,
so their refresh threads do not pile up (checked in a real kernel, with the cell id
JupyterLab sends in each execute request)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel

REPO = Path(__file__).resolve().parents[2]
COUNT = (
    "import threading; print(sorted(t.name for t in threading.enumerate() "
    "if t.name.startswith('workbench-')))"
)
CELL = """
from workbench.ui import MonitorPanel
panel = MonitorPanel(refresh_s=0.25)
panel
"""


def _run(kc, code: str, cell_id: str | None = None) -> str:
    metadata = {"cellId": cell_id} if cell_id else {}
    msg = kc.session.msg(
        "execute_request",
        {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        metadata=metadata,
    )
    kc.shell_channel.send(msg)
    out: list[str] = []
    while True:
        m = kc.get_iopub_msg(timeout=120)
        if m["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if m["msg_type"] == "stream":
            out.append(m["content"]["text"])
        elif m["msg_type"] == "error":
            raise AssertionError("\n".join(m["content"]["traceback"]))
        elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            return "".join(out)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("MPLBACKEND", "Agg")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_rerunning_a_cell_does_not_leak_refresh_threads(kernel) -> None:
    for _ in range(3):
        _run(kernel, CELL, cell_id="cell-monitor")
    threads = eval(_run(kernel, COUNT))  # noqa: S307 - our own printed list
    assert threads.count("workbench-ui-monitor") == 1, threads
    assert sum(t.startswith("workbench-sampler") for t in threads) == 1, threads
    _run(kernel, CELL, cell_id="another-cell")  # a different cell keeps both
    threads = eval(_run(kernel, COUNT))  # noqa: S307
    assert threads.count("workbench-ui-monitor") == 2, threads
    _run(kernel, "panel.close()")
    threads = eval(_run(kernel, COUNT))  # noqa: S307
    assert threads.count("workbench-ui-monitor") == 1, threads
