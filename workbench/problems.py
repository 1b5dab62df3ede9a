"""Invalid settings as data: `SettingProblem` (field, value, message) and `ConfigError`.

Every check of a setting collects `SettingProblem`s and raises one `ConfigError` (a
`ValueError`) listing them all, so a user sees every bad input at once. Other settings are
named in a message between backticks, so each front end renders its own names for them (the
command line its flags) from the data, never by reading the text back. Pure: imports nothing
of the package but `workbench.inputs`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.inputs import shown

_NAMED = re.compile(r"`(\w+)`(=?)")


@dataclass(frozen=True)
class SettingProblem:
    """One invalid setting, as data: the `field`, the `value` given and the `message` (what
    is allowed, or why the value cannot be). Other settings are named in the message
    between backticks, so each front end shows its own names for them: `str()` gives the
    Python names ("zero_stage=7: must be 0, 1, 2 or 3"), the command line its flags
    (`render(name=flag_of, value_text=as_typed, sep=" ")`)."""

    field: str
    value: Any
    message: str

    def render(
        self,
        name: Callable[[str], str] = str,
        value_text: str | None = None,
        sep: str = "=",
    ) -> str:
        """`field=value: message`, with `name` mapping setting names (the field's and the
        backticked ones), `value_text` instead of the value's repr ("" leaves it out) and
        `sep` between a name and its value."""
        message = _NAMED.sub(lambda m: name(m.group(1)) + (sep if m.group(2) else ""), self.message)
        value = shown(self.value) if value_text is None else value_text
        return f"{name(self.field)}{sep + value if value else ''}: {message}"

    def __str__(self) -> str:
        return self.render()


class ConfigError(ValueError):
    """A `ValueError` listing every invalid setting at once; `.problems` holds them as
    `SettingProblem`s, and the text is made from them."""

    def __init__(self, problems: list[SettingProblem]) -> None:
        self.problems = list(problems)
        super().__init__(format_problems([str(p) for p in self.problems]))


def problem_lines(exc: BaseException) -> list[str]:
    """The problems of an error, one line each, rendered from its data: a `ConfigError`'s
    (or any error carrying `.problems`: a ladder's, a DeepSpeed config's); for an error
    without them, its text as the one line."""
    problems = getattr(exc, "problems", None)
    if isinstance(problems, list) and problems:
        return [str(p) for p in problems]
    return [str(exc)]


def listing(lines: Sequence[str], one: str, many: str) -> str:
    """The text of an error listing `lines`: "`one`: line" for one, else "N `many`:" and
    one indented line each (every typed error of the package words itself this way)."""
    if len(lines) == 1:
        return f"{one}: {lines[0]}"
    return f"{len(lines)} {many}:\n" + "\n".join(f"  - {x}" for x in lines)


def format_problems(problems: list[str]) -> str:
    """The text of a ValueError listing `problems` (one line, or a counted list)."""
    return listing(problems, "invalid setting", "invalid settings")


__all__ = ["ConfigError", "SettingProblem", "format_problems", "listing", "problem_lines"]
