"""Counts written the way people say them: `7B`, `1.5e9`, `175B`, `350M`, `1.3T`.

`parse_count` is the one reader of parameter and token counts for the estimator, the CLI
and the panels. Suffixes (case-insensitive): K = 1e3, M = 1e6, B or G = 1e9, T = 1e12, and
the binary Ki = 2^10, Mi = 2^20, Gi = 2^30, Ti = 2^40 (a token batch of power-of-two
sequences: 4Mi = 1024 x 4096); a space may stand before the suffix (`7 B`). Digits may be grouped in thousands by commas,
underscores or spaces (`124,439,808`, `124_439_808`), one kind of separator per count and
groups of exactly three digits after the first: `1,2,3` is refused, never read as 123. The
value must be a whole number after scaling (`1.5e9`, `7.25B`); `1.5` parameters is refused.
Numbers may be Python or numpy integers and floats (bools are refused).
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from typing import Any

from workbench.estimate.limits import is_bool

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12,
           "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
_LARGEST = 10**30  # beyond any real count; keeps Decimal from huge exponents
_MAX_TEXT = 100  # characters: no count is written longer
_COUNT = re.compile(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]{1,3})?) ?([kmgt]i|[kmbgt]|)")
_GROUPED = {sep: re.compile(rf"[0-9]{{1,3}}(?:{re.escape(sep)}[0-9]{{3}})+") for sep in ",_ "}

#: What a count may look like, for error messages.
COUNT_EXAMPLES = "e.g. 7B, 1.5e9, 350M or 1.3T"


def _ungrouped(text: str) -> str | None:
    """`text` without its thousands separators, or None when they do not group by three."""
    number = re.match(r"[0-9,_ ]*", text)
    head = number.group(0).rstrip(" ") if number else ""
    seps = {c for c in head if c in ",_ "}
    if not seps:
        return text
    if len(seps) > 1 or not _GROUPED[seps.pop()].fullmatch(head):
        return None
    return head.replace(",", "").replace("_", "").replace(" ", "") + text[len(head) :]


def read_count(value: Any) -> int | str:
    """The whole count >= 0 in `value`, or a reason (a message ending) why it is not one."""
    if is_bool(value):
        return "a bool is not a count"
    if type(value) is not float:  # a float has no index: no exception to raise and catch
        try:
            n = operator.index(value)
        except TypeError:
            pass
        else:
            return n if n >= 0 else "a count is not negative"
    if type(value) is float or (isinstance(value, numbers.Real) and not isinstance(value, str)):
        try:
            number = float(value)
        except (OverflowError, ValueError, TypeError):
            return "not a finite number"
        if not math.isfinite(number):
            return "not a finite number"
        if number < 0:
            return "a count is not negative"
        if not number.is_integer():
            return "not a whole number"
        return int(number)
    if not isinstance(value, str):
        return f"not a number or text ({type(value).__name__})"
    text = value.strip().lower()
    if len(text) > _MAX_TEXT:
        return f"longer than {_MAX_TEXT} characters"
    plain = _ungrouped(text)
    if plain is None:
        return "separators must group the digits by three (1,000,000 or 1_000_000)"
    m = _COUNT.fullmatch(plain)
    if m is None:
        return "not a count"
    from decimal import Decimal  # text only: keeps the import off the numeric path

    exact = Decimal(m.group(1)) * _SUFFIX[m.group(2)]  # exact: 7.3B is 7_300_000_000
    if exact > _LARGEST:
        return "more than 10^30"
    if exact != exact.to_integral_value():
        return "not a whole number"
    return int(exact)


def parse_count(value: Any) -> int | None:
    """A whole count >= 0 from an int, an integral float or text such as `7B`; None
    when `value` is not one (bools, junk text, NaN, fractions, negative numbers,
    digits grouped other than by three)."""
    n = read_count(value)
    return n if isinstance(n, int) else None
