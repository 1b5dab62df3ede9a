"""The training panel's setting controls: one per TrainConfig field that declares a panel
place (`workbench.config.Setting.panel`), with its label, kind, choices and limits as
declared there; the widget each gets, and the parsing of what is typed into it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from workbench.config import SETTINGS, setting_choices
from workbench.ui.fields import Field, dropdown_field, parse_float, parse_int, text_field


@dataclass(frozen=True)
class Control:
    """One setting's control on the panel."""

    name: str  # TrainConfig field
    label: str
    kind: str  # "int" | "float" | "optional-float" | "choice" | "bool"
    options: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None


def make_controls() -> tuple[Control, ...]:
    """The panel's controls, made from the TrainConfig fields that declare a panel place
    (`workbench.config.Setting.panel`): label, kind, choices and limits as declared there."""
    out = []
    for name, spec in SETTINGS.items():
        if spec.panel is None:
            continue
        low = spec.minimum if spec.minimum is not None else spec.above
        if spec.kind == "choice":
            out.append(
                (
                    spec.panel,
                    Control(name, spec.label, "choice", tuple(setting_choices(name))),
                )
            )
        elif spec.values:
            out.append((spec.panel, Control(name, spec.label, "choice", spec.values)))
        elif spec.kind == "bool":
            out.append((spec.panel, Control(name, spec.label, "bool")))
        else:
            kind = "optional-float" if spec.kind == "float" and spec.optional else spec.kind
            out.append(
                (spec.panel, Control(name, spec.label, kind, minimum=low, maximum=spec.maximum))
            )
    return tuple(control for _, control in sorted(out, key=lambda item: item[0]))


CONTROLS: tuple[Control, ...] = make_controls()


def plain(v: Any) -> Any:
    """A setting's value as a control shows it (an enum as its value)."""
    return getattr(v, "value", v) if not isinstance(v, (bool, int, float, str)) else v


def fmt_value(v: Any) -> str:
    """A setting's value as text (floats without trailing zeros)."""
    v = plain(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def parse_control(c: Control, raw: Any) -> Any:
    """The value typed or chosen in control `c`, checked against its limits (ValueError
    naming the control otherwise); choices and switches as they are."""
    if c.kind == "int":
        return parse_int(
            c.label,
            str(raw),
            minimum=int(c.minimum or 0),
            maximum=None if c.maximum is None else int(c.maximum),
        )
    if c.kind == "float":
        return parse_float(
            c.label, str(raw), minimum=c.minimum, maximum=c.maximum, exclusive_minimum=True
        )
    if c.kind == "optional-float":
        return parse_float(
            c.label,
            str(raw),
            minimum=c.minimum,
            maximum=c.maximum,
            exclusive_minimum=True,
            optional=True,
        )
    return raw


def control_field(c: Control, value: Any) -> Field:
    """The widget of control `c` showing `value` (css class `wb-train-<name>`)."""
    css = f"wb-train-{c.name.replace('_', '-')}"
    if c.kind == "choice":
        return dropdown_field(c.label, c.options, value, css)
    if c.kind == "bool":
        return Field(c.label, widgets.Checkbox(value=bool(value), indent=False), css)
    field = text_field(c.label, "" if value is None else fmt_value(value), css)
    if c.kind == "optional-float":
        field.widget.placeholder = "empty: no clipping"
    return field
