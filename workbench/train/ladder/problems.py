"""A ladder's problems as data: `LadderProblem` (the argument or rung setting, the value,
the message, and the rung it is in) and `LadderError`, the ValueError listing them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from workbench.problems import SettingProblem, listing


@dataclass(frozen=True)
class LadderProblem(SettingProblem):
    """One problem of a ladder: `field` (a ladder argument such as "steps", or a setting
    of a rung), `value`, `message`; `where`: the rung it is in ("rung 2 '+ AMP'"; "" for
    the ladder's own arguments); `value_text`: the value as the check wrote it (None: its
    repr; "": no value shown). An empty `field`: the message says it all (a rung that
    changes nothing, what this machine cannot run), shown as it is."""

    where: str = ""
    value_text: str | None = None

    def render(
        self,
        name: Callable[[str], str] = str,
        value_text: str | None = None,
        sep: str = "=",
    ) -> str:
        if self.field:
            given = self.value_text if value_text is None else value_text
            text = super().render(name, given, sep)
        else:
            text = self.message
        return f"{self.where}: {text}" if self.where else text


def said(text: str, *, where: str = "") -> LadderProblem:
    """A problem that its text says whole (in the rung `where`)."""
    return LadderProblem("", None, text, where=where)


def in_rung(problems: Iterable[SettingProblem], *, where: str = "") -> list[LadderProblem]:
    """Problems another check found (a launch's, a Session's, a model spec's: each a
    `SettingProblem`), as the ladder's, in the rung `where` ("" for the ladder's own
    arguments)."""
    return [LadderProblem(p.field, p.value, p.message, where=where) for p in problems]


def of_error(
    exc: BaseException, *, where: str = "", message: Callable[[str], str] = str
) -> list[LadderProblem]:
    """The problems of a settings error (a TrainConfig's `ConfigError`) in the rung
    `where`, each message through `message`; an error without `.problems` as its text."""
    problems = getattr(exc, "problems", None)
    if not (isinstance(problems, list) and problems):
        return [said(str(exc), where=where)]
    return [
        LadderProblem(p.field, p.value, message(p.message), where=where)
        if isinstance(p, SettingProblem) and not isinstance(p, LadderProblem)
        else said(str(p), where=where)
        for p in problems
    ]


class LadderError(ValueError):
    """A ladder that cannot run: `.problems` holds every problem as a `LadderProblem`
    (the ladder's arguments and each rung's), and the text is made from them."""

    def __init__(self, problems: Sequence[LadderProblem]) -> None:
        self.problems = list(problems)
        lines = [str(p) for p in self.problems]
        super().__init__(listing(lines, "invalid ladder", "problems in the ladder"))


__all__ = ["LadderError", "LadderProblem", "in_rung", "of_error", "said"]
