"""Building a frozen dataclass whose every field is known, in one step.

A frozen dataclass's generated `__init__` sets each field with `object.__setattr__`; the
estimator builds its inputs (about 45 fields) and its result (about 65) on every call, and
those calls were a tenth of an estimate. `of_every_field` makes the same object by filling
its `__dict__` at once, when the values name every field exactly once (no default to fill,
no `__post_init__` to run: the classes it is used for have none); any other set of names
goes through `__init__`, which fills defaults and refuses unknown names.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def field_names(cls: type) -> frozenset[str]:
    """The names of dataclass `cls`'s fields."""
    return frozenset(f.name for f in fields(cls))


def of_every_field(cls: type[T], names: frozenset[str], values: dict[str, Any]) -> T:
    """`cls(**values)` for dataclass `cls` whose fields are `names` (`field_names(cls)`;
    `cls` has no `__post_init__` and no `__slots__`).

    The callers pass dict displays that name every field (tests/unit/
    test_estimate_fast_paths.py holds each result equal to the constructor's), so only
    the count is compared here: comparing the names cost as much as filling the object;
    a display with a field missing makes `cls(**values)` fill its default or refuse."""
    if len(values) != len(names):
        return cls(**values)
    made = object.__new__(cls)
    made.__dict__.update(values)
    return made


__all__ = ["field_names", "of_every_field"]
