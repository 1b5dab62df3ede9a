"""A DeepSpeed config's problems as data: `KeyProblem` (the key path, the value, the
reason) and `DeepSpeedConfigError`, the ValueError listing them. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.inputs import shown
from workbench.problems import SettingProblem, listing


@dataclass(frozen=True)
class KeyProblem(SettingProblem):
    """One problem of a DeepSpeed config: `field` is the key path
    ("zero_optimization.stage"), `value` the value it holds and `message` the reason
    (DeepSpeed's own words where DeepSpeed refuses it; shown as it is). `value_text`: the
    value as the config writes it (None: its repr; "": the problem names no single value,
    as for a missing key). An empty `field`: the config as a whole, said by the message
    alone."""

    value_text: str | None = None

    def render(
        self,
        name: Callable[[str], str] = str,
        value_text: str | None = None,
        sep: str = "=",
    ) -> str:
        """`path=value: reason`, with `name` mapping the key path and `value_text`
        replacing the value's text ("" leaves it out)."""
        if not self.field:
            return self.message
        text = self.value_text if value_text is None else value_text
        if text is None:
            text = shown(self.value)
        return f"{name(self.field)}{sep + text if text else ''}: {self.message}"


def keyed(path: str, message: str) -> KeyProblem:
    """A problem of the key at `path` that names no single value (missing, refused)."""
    return KeyProblem(path, None, message, value_text="")


def unique(problems: Sequence[KeyProblem]) -> list[KeyProblem]:
    """`problems` without repeats (the same text twice), in their order."""
    seen: dict[str, KeyProblem] = {}
    for p in problems:
        seen.setdefault(str(p), p)
    return list(seen.values())


class DeepSpeedConfigError(ValueError):
    """A DeepSpeed config that cannot be imported: `.problems` holds every problem as a
    `KeyProblem`, and the text is made from them."""

    def __init__(self, problems: Sequence[KeyProblem]) -> None:
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        super().__init__(listing(lines, "invalid DeepSpeed config", "problems in DeepSpeed config"))


class MappedConfigError(ValueError):
    """A DeepSpeed config whose settings are each valid but together make an invalid
    TrainConfig: `.problems` are the TrainConfig's, each naming its DeepSpeed key too."""

    def __init__(self, error: Any, keys_text: str, key_of_field: Mapping[str, str]) -> None:
        self.problems = [
            SettingProblem(
                p.field,
                p.value,
                p.message
                + (f" (DeepSpeed key {key_of_field[p.field]})" if p.field in key_of_field else ""),
            )
            for p in error.problems
        ]
        super().__init__(f"DeepSpeed config maps to an invalid TrainConfig: {error}{keys_text}")


__all__ = ["DeepSpeedConfigError", "KeyProblem", "MappedConfigError", "keyed", "unique"]
