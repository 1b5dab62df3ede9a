"""Text fields the panels share: parsing what was typed (errors name the field and
what is allowed), labelled inputs with an error label, status lines, units.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable
from typing import Any

import ipywidgets as widgets

from workbench.inputs import shown, ungrouped

GIB = 1 << 30
GB = 10**9
UNITS = {"GiB": GIB, "GB": GB}

# --------------------------------------------------------------------------- parsing


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
    raw = ungrouped(text.strip().replace("_", ""))
    allowed = f"a whole number {_range_text(minimum, maximum)}"
    if raw is not None and not raw:
        raise ValueError(f"{label}: empty; enter {allowed}")
    try:
        value = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{label}: {shown(text.strip())} is not {allowed}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{label}: {shown(value)} is out of range; enter {allowed}")
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
    raw = ungrouped(text.strip().replace("_", ""))
    if exclusive_minimum and minimum is not None:
        rng = f"> {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
    else:
        rng = _range_text(minimum, maximum)
    allowed = f"a number {rng}" + (" or empty for none" if optional else "")
    if raw is not None and not raw:
        if optional:
            return None
        raise ValueError(f"{label}: empty; enter {allowed}")
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{label}: {shown(text.strip())} is not {allowed}") from None
    bad = not math.isfinite(value)
    if minimum is not None:
        bad = bad or (value <= minimum if exclusive_minimum else value < minimum)
    if maximum is not None:
        bad = bad or value > maximum
    if bad:
        raise ValueError(f"{label}: {shown(raw)[1:-1]} is out of range; enter {allowed}")
    return value


def parse_count(label: str, text: str, *, minimum: int = 1) -> int:
    """A count such as a parameter count: `7e9`, `7B`, `350M`, `1.3b`, `124,000,000`
    (read by the estimator's own `parse_count`), or ValueError naming the field."""
    from workbench.estimate.counts import COUNT_EXAMPLES
    from workbench.estimate.counts import parse_count as read_count

    raw = text.strip()
    allowed = f"a count from {minimum:g} to 10^16 ({COUNT_EXAMPLES})"
    if not raw:
        raise ValueError(f"{label}: empty; enter {allowed}")
    value = read_count(raw)  # its own rules for separators: digits grouped by three
    if value is None:
        raise ValueError(f"{label}: {shown(raw)} is not {allowed}")
    if value < minimum or value > 10**16:
        raise ValueError(f"{label}: {shown(raw)} is out of range; enter {allowed}")
    return value


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
