"""How one TrainConfig field declares itself (`Setting`, in the field's metadata) and the
check of one field's value on its own against its declaration.

`workbench.config` declares every field with `setting(default, kind=..., label=...)`; its
checks, docstring, the CLI flags and the training panel's controls are made from these
declarations. Below config.py: imports the choices, the input predicates and the LoRA
target check only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from workbench.choices import ENUM_FIELDS, Recompute
from workbench.inputs import is_int, is_number
from workbench.problems import SettingProblem
from workbench.settings_check import LORA_TARGETS_TEXT, lora_targets_ok

_MAX_PATH = 4096  # PATH_MAX on Linux

#: FSDP's `fsdp_units`: a keyword, or comma-separated class names / qualified-name patterns.
FSDP_UNITS_TEXT = (
    '"blocks", "blocks-only" or comma-separated module class names or qualified-name '
    'patterns made of letters, digits, "_", ".", "*", "?" and "-" (e.g. '
    '"LlamaDecoderLayer,lm_head" or "model.layers.*"), at most 1000 characters'
)


def fsdp_units_ok(v: Any) -> bool:
    if not isinstance(v, str) or len(v) > 1000:
        return False
    names = [part.strip() for part in v.split(",") if part.strip()]
    return bool(names) and all(all(c.isalnum() or c in "_.*?-" for c in n) for n in names)


#: A text setting's check and what it accepts in words, by field.
TEXT_RULES = {
    "lora_targets": (lora_targets_ok, LORA_TARGETS_TEXT),
    "fsdp_units": (fsdp_units_ok, FSDP_UNITS_TEXT),
}


@dataclass(frozen=True)
class Setting:
    """What one TrainConfig field is, declared once beside the field (its metadata): the
    panel's label, one line of help, the command-line flag every command gives it, and its
    limits. TrainConfig's checks, its docstring, the CLI flags (`workbench.cli.config_flags`)
    and the training panel's controls are made from these.

    `kind`: "int", "float", "bool", "choice" (an enum field; its choices come from the
    enum), "path" or "text" (`lora_targets`, `fsdp_units`: `TEXT_RULES`). `minimum` / `above`: inclusive / exclusive lower bound; `maximum`
    (shown as `maximum_text`, with `why` a larger value is nonsense) / `below`: inclusive /
    exclusive upper bound. `optional`: None is allowed (and means `none_means`). `panel`:
    the control's place in the training panel (None: no control). `rebuilds`: what a change
    on a live Session rebuilds at the next step boundary: "data" (the data loader),
    "backend" (optimizer, precision policy, schedule, engine, carrying weights and
    optimizer state), "model" (switched on the module: recomputation, attention kernel),
    "forward" (the runtime's forward hooks); empty: nothing (read as it is, or set when a
    Session is built). `moves_memory`: a change moves the memory prediction (the field
    is an input of `workbench.prediction.estimator_inputs`, or of the module's adapter
    count), so the training panel measures memory again after it."""

    kind: str
    label: str
    help: str
    flag: str | None = None
    metavar: str | None = None
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    maximum_text: str = ""
    why: str = ""
    below: float | None = None
    optional: bool = False
    none_means: str = ""
    panel: int | None = None
    values: tuple[Any, ...] = ()  # the allowed values of an int field with few of them
    rebuilds: tuple[str, ...] = ()
    moves_memory: bool = False


def setting(default: Any, /, **declared: Any) -> Any:
    """A TrainConfig field with its `Setting` (see there) in the field's metadata."""
    return dataclasses.field(default=default, metadata={"setting": Setting(**declared)})


def limit_text(spec: Setting) -> str:
    return f", at most {spec.maximum_text} ({spec.why})" if spec.maximum is not None else ""


def allowed_for(name: str, spec: Setting) -> str:
    """What the setting `name` declared by `spec` accepts, in words ("an integer >= 1, at
    most 10^6 (...)")."""
    none = " or None" if spec.optional else ""
    if spec.kind == "choice":
        extra = " (or True: full, False: none)" if ENUM_FIELDS[name] is Recompute else ""
        return "one of " + ", ".join(ENUM_FIELDS[name].choices()) + extra
    if spec.kind == "bool":
        return "True or False"
    if spec.kind == "text":
        return TEXT_RULES[name][1]
    if spec.kind == "path":
        return (
            f"a directory path (a non-empty string of at most {_MAX_PATH} characters, no NUL)"
            + none
        )
    if spec.values:
        shown_values = [str(v) for v in spec.values]
        return ", ".join(shown_values[:-1]) + " or " + shown_values[-1]
    if spec.kind == "int":
        return f"an integer >= {int(spec.minimum or 0)}{none}{limit_text(spec)}"
    parts = []
    if spec.minimum is not None:
        parts.append(f">= {spec.minimum:g}")
    if spec.above is not None:
        parts.append(f"> {spec.above:g}")
    rng = " and ".join(parts + ([f"< {spec.below:g}"] if spec.below is not None else []))
    return f"a finite number {rng}{none}{limit_text(spec)}"


def field_problem(name: str, v: Any, spec: Setting) -> SettingProblem | None:
    """The problem of one non-choice field's value on its own, or None."""
    if spec.optional and v is None:
        return None
    if spec.kind == "bool":
        ok = isinstance(v, bool)
    elif spec.kind == "text":
        ok = TEXT_RULES[name][0](v)
    elif spec.kind == "path":
        ok = isinstance(v, str) and bool(v.strip()) and "\0" not in v and len(v) <= _MAX_PATH
    elif spec.kind == "int":
        ok = is_int(v) and (
            v in spec.values
            if spec.values
            else (spec.minimum is None or v >= spec.minimum)
            and (spec.maximum is None or v <= spec.maximum)
        )
    else:
        ok = (
            is_number(v)
            and (spec.minimum is None or v >= spec.minimum)
            and (spec.above is None or v > spec.above)
            and (spec.below is None or v < spec.below)
            and (spec.maximum is None or v <= spec.maximum)
        )
    return None if ok else SettingProblem(name, v, f"must be {allowed_for(name, spec)}")


__all__ = ["Setting", "allowed_for", "field_problem", "limit_text", "setting"]
