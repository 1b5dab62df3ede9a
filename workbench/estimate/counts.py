"""Counts written the way people say them: `7B`, `1.5e9`, `175B`, `350M`, `1.3T`.

`parse_count` is the one reader of parameter and token counts for the estimator, the CLI
and the panels. Suffixes (case-insensitive): K = 1e3, M = 1e6, B or G = 1e9, T = 1e12;
underscores, spaces and thousands commas are ignored (`124_439_808`, `124,439,808`). The value
must be a whole number after scaling (`1.5e9`, `7.25B`); `1.5` parameters is refused.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_LARGEST = 10**30  # beyond any real count; keeps Decimal from huge exponents
_COUNT = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)([kmbgt]?)$")

#: What a count may look like, for error messages.
COUNT_EXAMPLES = "e.g. 7B, 1.5e9, 350M or 1.3T"


def parse_count(value: Any) -> int | None:
    """A whole count >= 0 from an int, an integral float or text such as `7B`; None
    when `value` is not one (bools, junk text, NaN, fractions, negative numbers)."""
    if isinstance(value, bool):
        return None
    try:
        n = operator.index(value)
    except TypeError:
        pass
    else:
        return n if n >= 0 else None
    if isinstance(value, float):
        number = value
    elif isinstance(value, str):
        text = value.lower().replace("_", "").replace(",", "").replace(" ", "")
        m = _COUNT.match(text)
        if m is None:
            return None
        from decimal import Decimal  # text only: keeps the import off the numeric path

        exact = Decimal(m.group(1)) * _SUFFIX[m.group(2)]  # exact: 7.3B is 7_300_000_000
        if exact != exact.to_integral_value() or exact > _LARGEST:
            return None
        return int(exact)
    else:
        return None
    if not math.isfinite(number) or number < 0 or not number.is_integer():
        return None
    return int(number)
