"""One persistent matplotlib figure per chart, shown as a PNG (no pyplot), and PNG helpers."""

from __future__ import annotations

import io
import time
from typing import Any

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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
