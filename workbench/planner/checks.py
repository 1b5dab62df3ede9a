"""plan()'s numeric inputs read and checked: counts given as text ("1T", "4M") and the
numbers with the estimator's bounds (`workbench.estimate.limits`)."""

from __future__ import annotations

from typing import Any

from workbench.inputs import shown


class GlobalTokensError(ValueError):
    """`global_tokens` that is not a whole number of sequences: the count, the sequence
    length and why (`reason`), for a caller to say with the count as it was typed."""

    def __init__(self, tokens: Any, seq_len: int, reason: str) -> None:
        super().__init__(f"global_tokens={shown(tokens)}: {reason}")
        self.tokens, self.seq_len, self.reason = tokens, seq_len, reason


def counts(tokens: Any, global_tokens: Any) -> tuple[Any, Any]:
    """`tokens` and `global_tokens` given as text as the command takes them ("1T", "4M")
    read as counts (`workbench.estimate.parse_count`); ValueError naming text that is no
    count. Numbers pass as they are (checked where they are used)."""
    from workbench.estimate import parse_count

    read = []
    for name, value in (("tokens", tokens), ("global_tokens", global_tokens)):
        if isinstance(value, str):
            count = parse_count(value)
            if not count:
                raise ValueError(f"{name}={shown(value)}: must be a count > 0, e.g. 4Mi, 1T, 2e12")
            value = float(count) if name == "tokens" else count
        read.append(value)
    return read[0], read[1]


def checked_numbers(
    tokens: Any,
    price: Any,
    efficiency: Any,
    headroom: Any,
    *,
    rate_name: str = "efficiency",
    price_name: str = "price_per_gpu_hour",
) -> tuple[Any, Any, float]:
    """(tokens, price_per_gpu_hour, efficiency) read with the estimator's bounds
    (`workbench.estimate.limits`); ValueError naming the first out of range (headroom
    too: a fraction >= 0 and < 1). `rate_name`, `price_name`: the keywords the caller gave
    the efficiency and the price by (`mfu` or `efficiency`; `price`, the command's name, or
    `price_per_gpu_hour`), as the errors name them."""
    from workbench.estimate.limits import LIMITS, check_number

    read: list[float | None] = []
    for name, value, bound in (
        ("tokens", tokens, LIMITS["tokens"]),
        (price_name, price, LIMITS["price_per_gpu_hour"]),
    ):
        if value is None:
            read.append(None)
            continue
        number, problem = check_number(name, value, bound)
        if problem is not None:
            raise ValueError(f"{name}={shown(value)}: {problem}")
        read.append(float(number))
    if read[1] is not None and read[0] is None:
        raise ValueError(
            f"{price_name}={shown(price)}: the cost is of training the tokens; give "
            "tokens= too (the tokens to train)"
        )
    mfu = LIMITS["mfu"]
    number, problem = check_number(rate_name, efficiency, mfu)  # the estimator's range
    if problem is not None:
        raise ValueError(f"{rate_name}={shown(efficiency)}: {problem}")
    if (
        not isinstance(headroom, (int, float))
        or isinstance(headroom, bool)
        or not 0 <= headroom < 1
    ):
        raise ValueError(f"headroom={shown(headroom)}: must be a fraction >= 0 and < 1")
    return read[0], read[1], float(number)


__all__ = ["GlobalTokensError", "checked_numbers", "counts"]
