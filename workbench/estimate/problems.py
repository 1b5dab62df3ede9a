"""`Problem` and `EstimateInputError`: how the estimator reports invalid inputs.

Every check collects `Problem`s and raises one `EstimateInputError` listing them all, so a
user sees every bad input at once. Each message names the field, the value given and what
is allowed; other fields are named between backticks so that front ends can show their
own names for them (the CLI shows flags, the panels their labels).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from workbench.inputs import shown

_BACKTICK = re.compile(r"`(\w+)`")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Problem:
    """One invalid input: the field, the value given and what is allowed.

    Other fields are named in `message` between backticks, so a front end can show its
    own names for them (the CLI shows flags); `str()` shows the Python names.
    `needs_model`: the problem is that no model shape is known, which is said only when
    the model itself was not refused (a refused config.json is reported alone).
    """

    field: str
    value: Any
    message: str
    missing: bool = False
    needs_model: bool = False

    def render(
        self, name: Callable[[str], str] = str, value_text: str | None = None, sep: str = "="
    ) -> str:
        """`field=value: message`, with `name` mapping field names (the CLI passes one that
        gives flags), `value_text` replacing the value's bounded repr (`inputs.shown`: a
        long text is cut, a huge integer shown by its size) and `sep` the `=`."""
        msg = _BACKTICK.sub(lambda m: name(m.group(1)), self.message)
        if self.missing:
            return f"{name(self.field)} is missing: {msg}"
        text = shown(self.value) if value_text is None else value_text
        return f"{name(self.field)}{sep}{text}: {msg}"

    def __str__(self) -> str:
        return self.render()


class EstimateInputError(ValueError):
    """`ValueError` listing every invalid input at once; `.problems` holds them."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        if len(problems) == 1:
            text = f"invalid estimate input: {problems[0]}"
        else:
            text = f"{len(problems)} invalid estimate inputs:\n" + "\n".join(
                f"  - {p}" for p in problems
            )
        super().__init__(text)


def keywords_checked(fn: F) -> F:
    """`fn`, but a keyword it does not take (or a positional argument) is an
    `EstimateInputError` naming it, with the close keyword ("did you mean") and the known
    ones, instead of Python's TypeError."""
    import difflib
    import functools
    import inspect

    signature = inspect.signature(fn)
    known = [
        name
        for name, param in signature.parameters.items()
        if param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)
    ]

    names = frozenset(signature.parameters)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if args or not names.issuperset(kwargs):
            unknown = [k for k in kwargs if k not in names]
            problems = (
                [
                    Problem(
                        "arguments",
                        args,
                        f"{fn.__name__}() takes keyword arguments only ({', '.join(known)})",
                    )
                ]
                if args
                else []
            )
            for name in unknown:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                hint = f"did you mean {close[0]!r}? " if close else ""
                problems.append(
                    Problem(name, kwargs[name], f"unknown input; {hint}known: {', '.join(known)}")
                )
            raise EstimateInputError(problems)
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]
