"""Reading one estimator input: a number in its range (`checked`), a count such as "7B"
(`count`), one of a table's choices (`choice`) or a bool (`flag`). Each returns the value
read, or None (a flag: the value unchanged) with the problem appended to the list it is
given, so a caller collects every problem before raising (`inputs_check`).

Pure Python: imports no torch.
"""

from __future__ import annotations

from typing import Any

from workbench.estimate.counts import COUNT_EXAMPLES, read_count
from workbench.estimate.limits import LIMITS, as_bool, check_number
from workbench.estimate.problems import Problem

#: Each input's range where a plain `int` (integer inputs) or `float` (the others) inside
#: it reads as itself: `checked`'s fast path, which gives what `check_number` gives.
_INT_RANGES = {name: (b.low, b.high) for name, b in LIMITS.items() if b.integer and not b.low_open}
_FLOAT_RANGES = {
    name: (b.low, b.high) for name, b in LIMITS.items() if not b.integer and not b.low_open
}


def checked(p: list[Problem], name: str, value: Any) -> Any:
    """`value` read and range-checked as input `name` (see `limits`), or None with the
    problem appended to `p`."""
    kind = type(value)
    if kind is int:  # the common cases first: a plain number in range reads as itself
        bounds = _INT_RANGES.get(name)
        if bounds is not None and bounds[0] <= value <= bounds[1]:
            return value
    elif kind is float:
        bounds = _FLOAT_RANGES.get(name)
        if bounds is not None and bounds[0] <= value <= bounds[1]:  # NaN is not
            return value
    number, message = check_number(name, value)
    if message is not None:
        p.append(Problem(name, value, message))
    return number


def count(p: list[Problem], name: str, value: Any) -> int | None:
    """A count (`n_params`, `tokens`: a number or text such as "7B") in its range, or None
    with the problem appended to `p`."""
    bound = LIMITS[name]
    got = read_count(value)
    allowed = f"must be a whole number from 1 to {bound.high_text}"
    if (isinstance(got, int) and got > bound.high) or got == "more than 10^30":
        p.append(Problem(name, value, bound.too_large()))
        return None
    if isinstance(got, str) or got < 1:
        hint = f"; {got}" if isinstance(got, str) and "separators" in got else ""
        p.append(Problem(name, value, f"{allowed} ({COUNT_EXAMPLES}){hint}"))
        return None
    return got


def choice(p: list[Problem], name: str, v: Any, table: dict[str, Any]) -> Any:
    """The entry of `table` that text `v` names (case and spaces aside), or None with the
    problem appended to `p`."""
    # the table's keys are stripped and lower case (`inputs_check._table`): one given so is found as is
    found = table.get(v) if type(v) is str else None
    if found is None:
        found = table.get(v.strip().lower()) if isinstance(v, str) else None
    if found is None:
        p.append(Problem(name, v, f"must be one of {', '.join(table)}"))
    return found


def flag(p: list[Problem], name: str, value: Any) -> Any:
    """`value` as a bool (a numpy bool too), or unchanged with the problem appended."""
    if value is True or value is False:
        return value
    flag = as_bool(value)
    if not isinstance(flag, bool):
        p.append(Problem(name, flag, "must be True or False"))
    return flag


__all__ = ["checked", "choice", "count", "flag"]
