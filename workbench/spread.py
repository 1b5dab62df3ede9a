"""How much a measurement varies, and drawing it: one method for every report.

* `spread(values)`: the median with the 25th and 75th percentiles (`Spread`), the quartiles
  by `statistics.quantiles(..., method="inclusive")` (for 1, 2, 3, 4, 5: 2 and 4); the
  compression report's latency uses it whole (a typical latency is a median), the ladder
  its percentiles only (the spread of its windows' rates: a rate itself is a ratio of sums,
  `workbench.rates`, never a median).
* `spread_bars(ax, values, ...)`: horizontal bars, one per row, each with its 25th-75th
  percentile range as whiskers when given and its figure written at the end of the bar or
  whisker.
* `figure_png(figure)`: a matplotlib `Figure` as PNG bytes.

Pure Python: matplotlib is only used through the objects handed in.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

#: The whiskers' colour, cap width (points) and line width.
WHISKER_COLOUR = "#424242"
WHISKER_CAP = 3
WHISKER_WIDTH = 0.9


class Spread(NamedTuple):
    """The median of some values with their 25th and 75th percentiles."""

    median: float
    p25: float
    p75: float


def spread(values: Iterable[float]) -> Spread | None:
    """The median and 25th/75th percentiles of the finite `values` (one value: itself
    three times); None when there are none."""
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return None
    if len(vals) == 1:
        return Spread(vals[0], vals[0], vals[0])
    q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    return Spread(statistics.median(vals), q1, q3)


def spread_bars(
    ax: Any,
    values: Sequence[float],
    *,
    colours: Sequence[str],
    texts: Sequence[str],
    ranges: Sequence[tuple[float, float]] | None = None,
    fontsize: float = 8,
) -> Any:
    """Draw one horizontal bar per value on `ax` (row i at y=i), coloured by `colours`,
    with `ranges` (each row's (low, high), e.g. its 25th and 75th percentiles) as whiskers
    when given, and each row's text just past its bar or whisker. Returns the bars."""
    y = list(range(len(values)))
    bars = ax.barh(y, values, color=list(colours))
    ends = list(values)
    if ranges is not None:
        low = [max(0.0, v - lo) for v, (lo, _) in zip(values, ranges, strict=True)]
        high = [max(0.0, hi - v) for v, (_, hi) in zip(values, ranges, strict=True)]
        ax.errorbar(
            values,
            y,
            xerr=[low, high],
            fmt="none",
            ecolor=WHISKER_COLOUR,
            capsize=WHISKER_CAP,
            lw=WHISKER_WIDTH,
        )
        ends = [v + h for v, h in zip(values, high, strict=True)]
    for bar, end, text in zip(bars, ends, texts, strict=True):
        ax.annotate(
            text,
            (end, bar.get_y() + bar.get_height() / 2),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=fontsize,
        )
    return bars


def figure_png(figure: Any, dpi: int = 80) -> bytes:
    """A matplotlib `Figure` as PNG bytes (trimmed to what it draws)."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


__all__ = ["Spread", "figure_png", "spread", "spread_bars"]
