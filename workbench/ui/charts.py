"""One persistent matplotlib figure per chart, shown as a PNG (no pyplot), PNG helpers, and
`Downsampled`: a chart series in bounded memory that keeps its extremes."""

from __future__ import annotations

import io
import math
import time
from typing import Any

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from workbench.inputs import shown

# --------------------------------------------------------------------------- series
#: Buckets a downsampled series stores (between half this and this many at any time).
SERIES_BUCKETS = 1024
#: Points a chart line draws at most: about two per pixel column of a panel's chart.
SERIES_POINTS = 1000


class Downsampled:
    """The (x, y) points of a line chart in bounded memory, at any length of run.

    Points arrive in increasing x and fold into buckets of `stride` consecutive points;
    each bucket keeps its lowest and its highest point, so a spike or a dip is never
    dropped. When there are more than `buckets` buckets, neighbours merge and the stride
    doubles. `points(limit)` draws from them at most `limit` points (plus the newest, so
    the line reaches the current step): when there are more, neighbouring buckets are
    grouped into `limit // 2` bins, each again giving its lowest and highest point. So a
    line costs the same to draw at a thousand steps and at a million, and a short series
    (at most `limit // 2` points) is drawn as given. Non-finite values (a NaN loss) have
    no place on a line and are skipped.
    """

    __slots__ = (
        "bucket_limit",
        "stride",
        "count",
        "_buckets",
        "_open",
        "_last",
        "_array",
        "_array_key",
    )

    def __init__(self, buckets: int = SERIES_BUCKETS) -> None:
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 2:
            raise ValueError(f"buckets={shown(buckets)}: must be an integer >= 2")
        self.bucket_limit = buckets
        self.stride = 1
        self.count = 0  # finite points appended
        # a bucket: [n, low x, low y, high x, high y]
        self._buckets: list[list[float]] = []
        self._open: list[float] | None = None
        self._last: tuple[float, float] | None = None
        # the closed buckets as a numpy array, extended as buckets close: a redraw
        # converts only what is new (keyed by (stride, rows converted))
        self._array = np.empty((0, 4))
        self._array_key = (1, 0)

    def append(self, x: float, y: float | None) -> None:
        if y is None or not math.isfinite(y):
            return
        self.count += 1
        self._last = (x, y)
        b = self._open
        if b is None:
            b = self._open = [0, x, y, x, y]
        b[0] += 1
        if y < b[2]:
            b[1], b[2] = x, y
        if y > b[4]:
            b[3], b[4] = x, y
        if b[0] >= self.stride:
            self._buckets.append(b)
            self._open = None
            if len(self._buckets) > self.bucket_limit:
                self._merge()

    def _merge(self) -> None:
        merged = []
        buckets = self._buckets
        for i in range(0, len(buckets) - 1, 2):
            a, b = buckets[i], buckets[i + 1]
            low = a if a[2] <= b[2] else b
            high = a if a[4] > b[4] else b
            merged.append([a[0] + b[0], low[1], low[2], high[3], high[4]])
        if len(buckets) % 2:
            self._open = buckets[-1]  # half a bucket at the new stride: still filling
        self._buckets = merged
        self.stride *= 2

    def _bins(self, bins: int) -> Any:
        """The buckets as rows (low x, low y, high x, high y), grouped into at most `bins`
        bins of neighbours (in numpy: a redraw's cost stays in C, whatever the run)."""
        stride, done = self._array_key
        if stride != self.stride:  # merged since: convert again
            self._array, done = np.empty((0, 4)), 0
        if done < len(self._buckets):
            new = np.asarray(self._buckets[done:], dtype=float)[:, 1:]
            self._array = np.concatenate((self._array, new))
        self._array_key = (self.stride, len(self._buckets))
        a = self._array
        if self._open is not None:
            a = np.concatenate((a, np.asarray([self._open[1:]], dtype=float)))
        m, bins = len(a), max(1, bins)
        if m <= bins:
            return a
        group = (np.arange(m) * bins) // m  # non-decreasing, every bin non-empty
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        low = np.lexsort((a[:, 1], group))[starts]  # per bin: the lowest bucket low
        high = np.lexsort((-a[:, 3], group))[starts]  # and the highest bucket high
        return np.column_stack((a[low, 0], a[low, 1], a[high, 2], a[high, 3]))

    def _with_newest(self, xs: Any, ys: Any) -> tuple[list[float], list[float]]:
        x, y = xs.tolist(), ys.tolist()
        if self._last is not None and x and x[-1] != self._last[0]:
            x.append(self._last[0])
            y.append(self._last[1])
        return x, y

    def highs(self, limit: int = SERIES_POINTS // 2) -> tuple[list[float], list[float]]:
        """(xs, ys): the highest point of each of at most `limit` bins (and the newest
        point): the upper envelope, for an area under the line."""
        b = self._bins(limit)
        return self._with_newest(b[:, 2], b[:, 3])

    def points(self, limit: int = SERIES_POINTS) -> tuple[list[float], list[float]]:
        """(xs, ys) in increasing x: the lowest and highest point of each bucket, or of
        each bin of neighbouring buckets when that would be more than `limit` points."""
        b = self._bins(limit // 2)
        lx, ly, hx, hy = b.T
        low_first = lx <= hx
        xs = np.column_stack((np.where(low_first, lx, hx), np.where(low_first, hx, lx)))
        ys = np.column_stack((np.where(low_first, ly, hy), np.where(low_first, hy, ly)))
        keep = np.column_stack((np.ones(len(b), dtype=bool), lx != hx))  # one if they meet
        return self._with_newest(xs[keep], ys[keep])


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


class ReportChart:
    """A finished report's chart as a PNG in an image widget (what `PanelBase.snapshot_png`
    reads: `png`, `render()`)."""

    def __init__(self, css_class: str) -> None:
        self.image = widgets.Image(
            format="png", layout=widgets.Layout(max_width="100%", height="auto")
        )
        self.image.add_class(css_class)
        self.png = b""

    def show(self, png: bytes) -> None:
        self.png = png
        self.image.value = png

    def render(self) -> bytes:
        return self.png
