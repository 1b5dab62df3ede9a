"""Readable forms of result objects: `str()` for a terminal, `_repr_html_()` for a notebook.

Pure Python (no torch), so the estimator's results use it too. A result class mixes in
`Readable` and implements `_display()`, returning a `Display`: a title and rows of
(label, value, ...) strings, units already applied. Bytes use binary units (KiB, MiB,
GiB), as `torch.cuda.memory_allocated` and nvidia-smi report them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def fmt_bytes(n: float | None) -> str:
    """`1536` -> "1.50 KiB"; None -> "n/a"."""
    if n is None:
        return "n/a"
    for unit, size in _BINARY:
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_seconds(s: float | None) -> str:
    """`0.0123` -> "12.3 ms"; None -> "n/a"."""
    if s is None:
        return "n/a"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_number(x: float | None, digits: int = 4) -> str:
    """A float to `digits` significant digits; None -> "n/a"."""
    if x is None:
        return "n/a"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def fmt_count(n: float | None) -> str:
    """`124_439_808` -> "124.4M"; None -> "n/a"."""
    if n is None:
        return "n/a"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


@dataclass(frozen=True)
class Display:
    """A titled table: `rows` of cells (strings); `header` names the columns, if any."""

    title: str
    rows: Sequence[Sequence[str]]
    header: Sequence[str] | None = None  # a table of numbers: columns after the first right-aligned
    notes: Sequence[str] = field(default_factory=tuple)

    def _right(self, column: int) -> bool:
        return self.header is not None and column > 0

    def text(self) -> str:
        table = [list(self.header)] if self.header else []
        table += [list(r) for r in self.rows]
        width = max((len(r) for r in table), default=0)
        cols = [max((len(r[i]) for r in table if i < len(r)), default=0) for i in range(width)]
        lines = [self.title]
        for i, row in enumerate(table):
            cells = [
                c.rjust(cols[j]) if self._right(j) else c.ljust(cols[j]) for j, c in enumerate(row)
            ]
            lines.append("  " + "  ".join(cells).rstrip())
            if i == 0 and self.header:
                lines.append("  " + "  ".join("-" * w for w in cols))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def html(self) -> str:
        esc = html.escape
        out = [
            "<div class='wb-result'>",
            f"<b>{esc(self.title)}</b>",
            "<table style='border-collapse:collapse;font-family:monospace'>",
        ]
        if self.header:
            out.append(
                "<tr>"
                + "".join(
                    f"<th style='text-align:{'right' if self._right(j) else 'left'};"
                    f"padding:0 8px'>{esc(h)}</th>"
                    for j, h in enumerate(self.header)
                )
                + "</tr>"
            )
        for row in self.rows:
            cells = [
                f"<td style='text-align:{'right' if self._right(j) else 'left'};padding:0 8px'>"
                f"{esc(c)}</td>"
                for j, c in enumerate(row)
            ]
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
        out += [f"<div style='color:#666'>{esc(n)}</div>" for n in self.notes]
        out.append("</div>")
        return "".join(out)


class Readable:
    """Mixin: `str()` and the notebook's HTML view from `_display()`; `repr()` unchanged."""

    def _display(self) -> Display:
        raise NotImplementedError

    def __str__(self) -> str:
        return self._display().text()

    def _repr_html_(self) -> str:
        return self._display().html()

    def _repr_pretty_(self, printer: object, cycle: bool) -> None:
        """IPython's plain-text view (a terminal IPython): the readable text."""
        printer.text(repr(self) if cycle else str(self))  # type: ignore[attr-defined]
