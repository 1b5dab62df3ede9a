"""Pieces the panels share: text-field parsing, labelled fields with an error label,
one persistent matplotlib figure rendered to a PNG `widgets.Image`, a refresh timer
thread, and the panel base class (static PNG next to the widget view, `close()`,
closing the panels an earlier run of the same notebook cell left behind).
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import math
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

GIB = 1 << 30
GB = 10**9
UNITS = {"GiB": GIB, "GB": GB}

MIN_REFRESH_SECONDS = 0.25  # charts refresh at most 4 times a second

# --------------------------------------------------------------------------- parsing

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT_RE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)$")


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _range_text(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"from {_num(minimum)} to {_num(maximum)}"
    if minimum is not None:
        return f">= {_num(minimum)}"
    if maximum is not None:
        return f"<= {_num(maximum)}"
    return "any value"


def parse_int(
    label: str, text: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """A whole number typed into a field, or ValueError naming the field and the range."""
    raw = text.strip().replace("_", "").replace(",", "")
    allowed = f"a whole number {_range_text(minimum, maximum)}"
    if not raw:
        raise ValueError(f"{label}: empty; enter {allowed}")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{label}: {text.strip()!r} is not {allowed}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{label}: {value} is out of range; enter {allowed}")
    return value


def parse_float(
    label: str,
    text: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    optional: bool = False,
) -> float | None:
    """A finite number typed into a field; empty gives None when `optional`."""
    raw = text.strip().replace("_", "").replace(",", "")
    if exclusive_minimum and minimum is not None:
        rng = f"> {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
    else:
        rng = _range_text(minimum, maximum)
    allowed = f"a number {rng}" + (" or empty for none" if optional else "")
    if not raw:
        if optional:
            return None
        raise ValueError(f"{label}: empty; enter {allowed}")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{label}: {text.strip()!r} is not {allowed}") from None
    bad = not math.isfinite(value)
    if minimum is not None:
        bad = bad or (value <= minimum if exclusive_minimum else value < minimum)
    if maximum is not None:
        bad = bad or value > maximum
    if bad:
        raise ValueError(f"{label}: {raw} is out of range; enter {allowed}")
    return value


def parse_count(label: str, text: str, *, minimum: int = 1) -> int:
    """A count such as a parameter count: `7e9`, `7B`, `350M`, `1.3b`, `124,000,000`."""
    raw = text.strip().replace("_", "").replace(",", "").lower()
    m = _COUNT_RE.match(raw)
    allowed = f"a count >= {minimum:g} such as 7e9, 7B, 350M or 124000000"
    if not raw:
        raise ValueError(f"{label}: empty; enter {allowed}")
    if m is None:
        raise ValueError(f"{label}: {text.strip()!r} is not {allowed}")
    value = float(m.group(1)) * _SUFFIX[m.group(2)]
    if not math.isfinite(value) or value < minimum or value > 1e16:
        raise ValueError(f"{label}: {text.strip()!r} is out of range; enter {allowed}")
    return int(round(value))


def format_bytes(n: float | None, units: str = "GiB", digits: int = 2) -> str:
    """Bytes in GiB or GB; "n/a" for None."""
    if n is None:
        return "n/a"
    return f"{n / UNITS[units]:,.{digits}f} {units}"


def format_seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"


# --------------------------------------------------------------------------- fields


class Field:
    """One labelled input with an error label beside it.

    `box` is the row (label, input, error). `set_error(msg)` shows the message next to the
    input; `set_error(None)` clears it.
    """

    def __init__(
        self, label: str, widget: widgets.ValueWidget, css: str, *, label_width: str = "130px"
    ) -> None:
        self.label = label
        self.widget = widget
        widget.add_class(css)
        widget.layout.width = widget.layout.width or "150px"
        self.error = widgets.HTML(
            value="", layout=widgets.Layout(margin="0 0 0 6px", max_width="320px")
        )
        self.error.add_class("wb-error")
        self.error.add_class(f"{css}-error")
        self.box = widgets.HBox(
            [
                widgets.HTML(
                    f"<b>{html.escape(label)}</b>", layout=widgets.Layout(width=label_width)
                ),
                widget,
                self.error,
            ],
            # a long message wraps under the input instead of squeezing it
            layout=widgets.Layout(align_items="center", flex_flow="row wrap"),
        )

    @property
    def value(self) -> Any:
        return self.widget.value

    def set_error(self, message: str | None) -> None:
        self.error.value = (
            "" if not message else f'<span style="color:#c62828">{html.escape(message)}</span>'
        )

    @property
    def error_text(self) -> str:
        """The message shown beside the field, as plain text ("" when none)."""
        return html.unescape(re.sub(r"<[^>]+>", "", self.error.value))


def text_field(label: str, value: str, css: str, placeholder: str = "") -> Field:
    """A free-text field (parsed by the panel, so typed garbage is caught and reported).
    `continuous_update=False`: the value is sent when the user presses Enter or leaves."""
    w = widgets.Text(value=value, placeholder=placeholder, continuous_update=False)
    return Field(label, w, css)


def dropdown_field(label: str, options: Iterable[Any], value: Any, css: str) -> Field:
    w = widgets.Dropdown(options=list(options), value=value)
    return Field(label, w, css)


def status_html(kind: str, message: str) -> str:
    colors = {"ok": "#2e7d32", "info": "#37474f", "warning": "#ef6c00", "error": "#c62828"}
    return f'<span style="color:{colors.get(kind, "#37474f")}">{html.escape(message)}</span>'


def strip_tags(value: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", value))


# --------------------------------------------------------------------------- charts


class Chart:
    """One persistent matplotlib figure shown as a PNG in a `widgets.Image`.

    Never goes through pyplot (no figure registry, no inline auto-display). `render()`
    draws the current artists into PNG bytes and swaps them into the image, which the
    front end updates in place, so a redraw does not flicker or add outputs.

    Artists registered with `animate()` are drawn over a cached background (axes, ticks,
    labels: most of the cost); the background is redrawn only after `invalidate()` (for
    example when axis limits change). `last_render_seconds` is what the last render took.
    """

    def __init__(self, width_in: float, height_in: float, *, dpi: int = 80, css: str = "") -> None:
        self.figure = Figure(figsize=(width_in, height_in), dpi=dpi)
        self.canvas = FigureCanvasAgg(self.figure)
        # natural pixel size, shrunk on narrow screens; not stretched by the flex box
        self.image = widgets.Image(
            format="png",
            layout=widgets.Layout(
                width=f"{round(width_in * dpi)}px",
                max_width="100%",
                height="auto",
                align_self="flex-start",
            ),
        )
        if css:
            self.image.add_class(css)
        self.png: bytes = b""
        self.renders = 0
        self.background_renders = 0
        self.last_render_seconds = 0.0
        self._animated: list[Any] = []
        self._background: Any = None

    def animate(self, *artists: Any) -> None:
        """Draw these artists on every render, over the cached background."""
        for a in artists:
            a.set_animated(True)
            self._animated.append(a)

    def forget(self, artist: Any) -> None:
        """Stop drawing an animated artist (call before `artist.remove()`)."""
        if artist in self._animated:
            self._animated.remove(artist)

    def invalidate(self) -> None:
        """The background changed (limits, ticks, labels): redraw it on the next render."""
        self._background = None

    def render(self) -> bytes:
        start = time.perf_counter()
        canvas = self.canvas
        if self._background is None or not self._animated:
            canvas.draw()  # everything except animated artists
            self.background_renders += 1
            self._background = canvas.copy_from_bbox(self.figure.bbox) if self._animated else None
        else:
            canvas.restore_region(self._background)
        for a in self._animated:
            if a.get_visible() and a.figure is not None:
                self.figure.draw_artist(a)
        self.png = encode_png(canvas)
        self.image.value = self.png
        self.renders += 1
        self.last_render_seconds = time.perf_counter() - start
        return self.png


def encode_png(canvas: FigureCanvasAgg) -> bytes:
    """The canvas's pixels as PNG, with fast (light) compression."""
    from PIL import Image as PILImage

    buf = canvas.buffer_rgba()
    img = PILImage.frombuffer("RGBA", (buf.shape[1], buf.shape[0]), buf, "raw", "RGBA", 0, 1)
    out = io.BytesIO()
    img.save(out, format="png", compress_level=1)
    return out.getvalue()


def stack_pngs(pngs: list[bytes]) -> bytes:
    """Several PNGs one above the other in one PNG (for a static fallback image)."""
    pngs = [p for p in pngs if p]
    if len(pngs) <= 1:
        return pngs[0] if pngs else b""
    import matplotlib.image as mpimg
    import numpy as np

    arrays = [mpimg.imread(io.BytesIO(p), format="png") for p in pngs]
    arrays = [a if a.shape[2] == 4 else np.dstack([a, np.ones(a.shape[:2])]) for a in arrays]
    width = max(a.shape[1] for a in arrays)
    padded = [
        np.pad(a, ((0, 0), (0, width - a.shape[1]), (0, 0)), constant_values=1.0) for a in arrays
    ]
    out = io.BytesIO()
    mpimg.imsave(out, np.concatenate(padded, axis=0), format="png")
    return out.getvalue()


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
                f"interval_s={interval_s!r}: must be a number of seconds >= "
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
