"""The panel base class and its refresh timer: a static PNG next to the widget view,
`close()`, and closing the panels an earlier run of the same notebook cell left behind.
"""

from __future__ import annotations

import base64
import contextlib
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from workbench.inputs import shown
from workbench.ui.charts import Chart, ReportChart, stack_pngs
from workbench.ui.fields import status_html

MIN_REFRESH_SECONDS = 0.25  # charts refresh at most 4 times a second

# --------------------------------------------------------------------------- timer


class RefreshTimer:
    """Calls `callback()` every `interval_s` seconds on a daemon thread until `stop()`.

    The callback only reads snapshots and sets output widgets; an exception in it is
    kept in `last_error` (and passed to `on_error`) and the timer keeps going.
    """

    def __init__(
        self,
        callback: Callable[[], None],
        interval_s: float = 0.5,
        *,
        name: str = "workbench-ui-refresh",
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if (
            isinstance(interval_s, bool)
            or not isinstance(interval_s, (int, float))
            or not math.isfinite(interval_s)
            or interval_s < MIN_REFRESH_SECONDS
        ):
            raise ValueError(
                f"interval_s={shown(interval_s)}: must be a number of seconds >= "
                f"{MIN_REFRESH_SECONDS} (at most 4 refreshes a second)"
            )
        self.interval_s = float(interval_s)
        self._callback = callback
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._name = name
        self.ticks = 0
        self.cpu_seconds = 0.0  # CPU time the callbacks used on the timer thread
        self.last_error: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            cpu = time.thread_time()
            try:
                self._callback()
            except Exception as exc:  # keep refreshing; say what went wrong
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self._on_error is not None:
                    with contextlib.suppress(Exception):
                        self._on_error(exc)
            self.ticks += 1
            self.cpu_seconds += time.thread_time() - cpu

    def stop(self) -> None:
        """Stop and join the thread (idempotent; safe from the callback itself)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10)
        self._thread = None


# --------------------------------------------------------------------------- panels


def _current_cell() -> tuple[Any, str | None, str | None]:
    """(IPython shell, cell id, execute-request msg id) of the notebook cell running now;
    (None, None, None) outside a kernel or when the front end sends no cell id."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        kernel = getattr(shell, "kernel", None)
        if kernel is None:
            return None, None, None
        parent = kernel.get_parent("shell") or {}
        cell_id = (parent.get("metadata") or {}).get("cellId")
        msg_id = (parent.get("header") or {}).get("msg_id")
        return shell, cell_id, msg_id
    except Exception:
        return None, None, None


def _register_with_cell(panel: PanelBase) -> None:
    """Close panels that an earlier run of this same cell created (re-running a cell must
    not leave their timers running). The registry lives on the IPython shell, so each
    kernel has its own and nothing is kept at module level."""
    shell, cell_id, msg_id = _current_cell()
    if shell is None or cell_id is None:
        return
    registry: dict[str, list[tuple[str | None, weakref.ref[PanelBase]]]] | None = getattr(
        shell, "_workbench_panels", None
    )
    if registry is None:
        registry = {}
        try:
            shell._workbench_panels = registry
        except Exception:
            return
    keep: list[tuple[str | None, weakref.ref[PanelBase]]] = []
    for old_msg, ref in registry.get(cell_id, []):
        old = ref()
        if old is None:
            continue
        if old_msg != msg_id:
            old.close()
        else:
            keep.append((old_msg, ref))
    keep.append((msg_id, weakref.ref(panel)))
    registry[cell_id] = keep


class PanelBase:
    """A panel: `widget` is its root ipywidgets box. Displaying a panel shows the live
    widget and carries a PNG of its charts for viewers without a kernel."""

    widget: widgets.Box

    def __init__(self) -> None:
        self._closed = False
        _register_with_cell(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def charts(self) -> list[Chart]:
        return []

    def snapshot_png(self) -> bytes:
        """The panel's current charts as one PNG."""
        pngs = []
        for chart in self.charts():
            pngs.append(chart.png or chart.render())
        return stack_pngs(pngs)

    def snapshot(self) -> Any:
        """The charts as they are now, as a plain image for a notebook output (it stays in
        the saved notebook, with or without widget state)."""
        from IPython.display import Image

        png = self.snapshot_png()
        if not png:
            raise ValueError(f"{type(self).__name__}: no charts to show")
        return Image(data=png, format="png")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        widget_bundle = getattr(self.widget, "_repr_mimebundle_", None)  # None once closed
        bundle: dict[str, Any] = dict(widget_bundle() or {}) if callable(widget_bundle) else {}
        png = self.snapshot_png()
        if png:
            bundle["image/png"] = base64.b64encode(png).decode("ascii")
        bundle["text/plain"] = repr(self)
        return bundle

    def close(self) -> None:
        """Stop timers and close the widgets (idempotent). Subclasses stop their timers
        first, then call this."""
        if self._closed:
            return
        self._closed = True
        close_tree(getattr(self, "widget", None))


class JobPanel(PanelBase):
    """A panel that runs one job at a time in a background thread and shows its report: a
    `status` line, the report's HTML `table` and its `chart`. `close()` cancels the job
    (`_cancel`, which the job checks) and waits for it."""

    def __init__(self, css: str, intro: str) -> None:
        super().__init__()
        self.error: str | None = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self.status = widgets.HTML(status_html("info", intro))
        self.status.add_class(f"wb-{css}-status")
        self.table = widgets.HTML()
        self.table.add_class(f"wb-{css}-table")
        self.chart = ReportChart(f"wb-{css}-chart")

    def charts(self) -> list[Any]:
        return [self.chart] if self.chart.png else []

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _show_status(self, kind: str, message: str) -> None:
        self.status.value = status_html(kind, message)

    def _start(
        self, target: Callable[..., None], args: tuple[Any, ...], name: str, wait: bool
    ) -> None:
        """Run `target(*args)` in a background thread named `name` (`wait`: until it ends)."""
        self._cancel.clear()
        self._thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._thread.start()
        if wait:
            self._thread.join()

    def close(self) -> None:
        if self.closed:
            return
        self._cancel.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=120)
        super().close()


def close_tree(widget: Any) -> None:
    """Close a widget and every widget below it (their comms and front-end views)."""
    if not isinstance(widget, widgets.Widget):
        return
    seen: set[int] = set()
    stack = [widget]
    while stack:
        w = stack.pop()
        if id(w) in seen:
            continue
        seen.add(id(w))
        for name in ("children", "left_sidebar", "right_sidebar", "header", "footer", "center"):
            child = getattr(w, name, None)
            if isinstance(child, (list, tuple)):
                stack.extend(c for c in child if isinstance(c, widgets.Widget))
            elif isinstance(child, widgets.Widget):
                stack.append(child)
        w.close()


class TabbedPanels(PanelBase):
    """Panels in tabs: their charts together, and `close()` closing the panels and then
    the objects the tabs created for them (`_owned`: a session, a sampler)."""

    _owned: list[Any]

    @property
    def panels(self) -> tuple[PanelBase, ...]:
        raise NotImplementedError

    def charts(self) -> list[Chart]:
        return [c for p in self.panels for c in p.charts()]

    def close(self) -> None:
        if self.closed:
            return
        for p in self.panels:
            p.close()
        for obj in self._owned:
            obj.close()
        super().close()
