"""TrainConfig settings as command-line flags, shared by `workbench export` and `workbench launch`.

    group = parser.add_argument_group("training settings (TrainConfig)")
    add_config_flags(group, fields=("precision", "zero_stage", "lr"))
    ...
    config, problems = config_from_args(args, fields=("precision", "zero_stage", "lr"))

Every flag is read as text (None when not given) and becomes a `TrainConfig.replace`
change; a TrainConfig error comes back as one problem line per setting, naming the flag
and the value as typed. Pure: imports no torch and no deepspeed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workbench.config import (
    SETTINGS,
    ConfigError,
    Setting,
    SettingProblem,
    TrainConfig,
    plain_value,
    problem_lines,
    setting_choices,
)
from workbench.inputs import shown, typed, ungrouped


@dataclass(frozen=True)
class ConfigFlag:
    """One TrainConfig field as a flag. `kind`: "int", "float", "str", "offload" (a device
    name; optionally a bare flag meaning cpu) or "switch" (store_true)."""

    flag: str
    kind: str
    metavar: str | None = None
    help: str | None = None


_KINDS = {
    "int": "int",
    "float": "float",
    "choice": "str",
    "path": "str",
    "text": "str",
    "bool": "switch",
}


def _flag_help(name: str, spec: Setting, default: Any) -> str:
    """A flag's help: what the setting is, what it accepts, its default."""
    if spec.kind == "choice":
        accepts = ", ".join(setting_choices(name))
        return f"{accepts} ({plain_value(default)}); {spec.help}"
    if spec.kind == "bool":
        return spec.help
    shown_default = "none" if default is None else plain_value(default)
    return f"{spec.help} ({shown_default})"


def _config_flags() -> dict[str, ConfigFlag]:
    """Every TrainConfig field that declares a flag (`Setting.flag`), in field order."""
    out = {}
    for f in dataclasses.fields(TrainConfig):
        spec = SETTINGS[f.name]
        if spec.flag is None:
            continue
        kind = "offload" if f.name in ("offload_optimizer", "offload_params") else _KINDS[spec.kind]
        out[f.name] = ConfigFlag(spec.flag, kind, spec.metavar, _flag_help(f.name, spec, f.default))
    return out


# TrainConfig field -> its flag, made from each field's `Setting`. Flags left out of a
# command keep the base config's (or default) value.
CONFIG_FLAGS: dict[str, ConfigFlag] = _config_flags()

_BARE_OFFLOAD = " (a bare flag means cpu)"


def _dest(name: str) -> str:
    return CONFIG_FLAGS[name].flag.lstrip("-").replace("-", "_")


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    fields: Sequence[str],
    bare_offload: bool = False,
    help: Mapping[str, str] | None = None,
) -> None:
    """Add a flag (as text, default None) for each TrainConfig field in `fields`, in that
    order. `bare_offload`: `--offload-optimizer` / `--offload-params` without a value mean
    cpu. `help` overrides a field's help text."""
    for name in fields:
        spec = CONFIG_FLAGS[name]
        text = (help or {}).get(name, spec.help)
        if spec.kind == "switch":
            parser.add_argument(spec.flag, action="store_true", default=None, help=text)
        elif spec.kind == "offload" and bare_offload:
            text = None if text is None else text.replace(";", _BARE_OFFLOAD + ";", 1)
            parser.add_argument(spec.flag, nargs="?", const="cpu", metavar=spec.metavar, help=text)
        elif name == "activation_checkpointing":  # a bare flag, as when it was a switch: full
            text = None if text is None else text.replace(";", " (a bare flag means full);", 1)
            parser.add_argument(spec.flag, nargs="?", const="full", metavar=spec.metavar, help=text)
        else:
            parser.add_argument(spec.flag, metavar=spec.metavar, help=text)


def parse_number(text: str, kind: str, flag: str, problems: list[str]) -> Any:
    """`text` as an int ("int") or a finite float ("float"); None, with a problem line
    "FLAG TEXT: must be an integer/a finite number", when it is not one. A thousands
    separator ("1,000") is no number: the line says to write it without one."""
    value = _number(text, kind)
    if value is None:
        what = "an integer" if kind == "int" else "a finite number"
        hint = " (commas only group digits in threes)" if "," in str(text) else ""
        problems.append(
            f"{flag} {shown(text)[1:-1] if len(str(text)) > 80 else text}: must be {what}{hint}"
        )
    return value


def _number(text: str, kind: str) -> Any:
    """An int or finite float from flag text, else None (never inf, nan or a bool). Only
    ASCII digits make a number: Python's int() and float() also read other scripts' digits
    ("١٢" is 12 to them), which no one types as a number by intent."""
    if not isinstance(text, str) or not text.isascii():
        return None
    plain = ungrouped(text)  # "1,000" is a thousand; "1,2,3" is no number
    if plain is None:
        return None
    try:
        if kind == "int":
            return int(plain)
        value = float(plain)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def raw_values(args: argparse.Namespace, fields: Sequence[str]) -> dict[str, str]:
    """The text given for each valued flag among `fields` (switches and absent flags left out)."""
    raw = {}
    for name in fields:
        value = getattr(args, _dest(name))
        if value is not None and CONFIG_FLAGS[name].kind != "switch":
            raw[name] = str(value)
    return raw


def config_from_args(
    args: argparse.Namespace,
    *,
    fields: Sequence[str],
    base: TrainConfig | None = None,
    check_numbers: bool = False,
    strip_text: bool = False,
    style: Literal["value", "parenthesized"] = "value",
    other_flags: Mapping[str, str] | None = None,
) -> tuple[TrainConfig | None, list[str]]:
    """`base` (default: `TrainConfig()`) with the flags of `fields` given in `args`
    applied, and the problems (the config is None when there are any).

    `check_numbers`: a number flag whose text is not a number is a problem of its own
    ("--lr x: must be a finite number"), named together with every problem of the other
    settings, and no config is built; otherwise the text is passed on and TrainConfig
    names it with every other problem. `strip_text`: text values lose
    surrounding whitespace (otherwise TrainConfig gets them as typed). `style` of a
    TrainConfig problem: "value" -> "--zero 7: must be 0, 1, 2 or 3"; "parenthesized" ->
    "--zero (zero_stage=7: must be 0, 1, 2 or 3)". `other_flags`: argument name -> flag
    of the command's other arguments, for "value" lines that mention them.
    """
    problems: list[str] = []
    changes: dict[str, Any] = {}
    for name in fields:
        spec = CONFIG_FLAGS[name]
        value = getattr(args, _dest(name))
        if value is None:
            continue
        if spec.kind in ("int", "float"):
            if check_numbers:
                value = parse_number(value, spec.kind, spec.flag, problems)
                if value is None:  # named above; the other settings are still checked
                    continue
            else:
                value = lenient_number(value, spec.kind)
        elif strip_text and spec.kind != "switch":
            value = value.strip()
        changes[name] = value
    try:
        config = (TrainConfig() if base is None else base).replace(**changes)
    except ConfigError as exc:
        found = exc.problems
    else:
        return (None, problems) if problems else (config, [])
    flags = {name: CONFIG_FLAGS[name].flag for name in fields}
    if style == "value":
        raw = raw_values(args, fields)
        return None, problems + [as_flag_problem(p, flags, raw) for p in found]
    out = list(problems)
    for p in found:
        out.append(f"{flags[p.field]} ({p})" if p.field in flags else str(p))
    return None, out


def as_flag_problem(
    problem: SettingProblem, flags: Mapping[str, str], raw: Mapping[str, str]
) -> str:
    """A TrainConfig problem written with the command's flags: "--zero 7: must be 0, 1, 2
    or 3", the value as typed (from `raw`) when there is one; settings without a flag keep
    their names. Made from the problem's data, never from its text."""

    def name(field: str) -> str:
        return flags.get(field, field)

    if problem.field in raw:
        value_text = typed(raw[problem.field])
    elif problem.value is None:
        value_text = ""
    else:
        value_text = shown(plain_value(problem.value)).strip("'\"")
    if problem.field not in flags:  # a setting this command has no flag for
        return problem.render()
    return problem.render(name=name, value_text=value_text, sep=" ")


def lenient_number(text: str, kind: str) -> Any:
    """Flag text -> int ("int") or float ("float"); text that is not one is passed on as it
    is (TrainConfig or the caller then names it together with every other problem)."""
    value = _number(text.replace("_", "") if kind == "int" else text, kind)
    return text if value is None else value


__all__ = [
    "CONFIG_FLAGS",
    "ConfigFlag",
    "add_config_flags",
    "as_flag_problem",
    "config_from_args",
    "lenient_number",
    "parse_number",
    "problem_lines",
    "raw_values",
]
