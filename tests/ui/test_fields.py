"""Numbers typed into a panel's fields: read strictly, or an error naming the field."""

from __future__ import annotations

import pytest

from workbench.ui.fields import parse_float, parse_int


@pytest.mark.parametrize(
    ("text", "value"), [("1,000,000", 1_000_000), ("12", 12), (" 3 ", 3), ("1_000", 1000)]
)
def test_whole_numbers(text, value) -> None:
    assert parse_int("micro-batch", text, minimum=1) == value


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("1,2,3", r"micro-batch: '1,2,3' is not a whole number >= 1"),
        ("1e3", r"'1e3' is not a whole number"),
        ("", r"micro-batch: empty; enter a whole number >= 1"),
        ("9" * 5000, r"micro-batch: '9999.*\.\.\. is not a whole number"),
        ("0", r"micro-batch: 0 is out of range"),
    ],
)
def test_bad_whole_numbers_name_the_field(text, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        parse_int("micro-batch", text, minimum=1)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("inf", "lr: inf is out of range"),
        ("nan", "lr: nan is out of range"),
        ("1,2", "'1,2' is not a number"),
    ],
)
def test_bad_numbers_name_the_field(text, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        parse_float("lr", text, minimum=0, exclusive_minimum=True)


def test_an_optional_number_may_be_empty() -> None:
    assert parse_float("clip", " ", optional=True) is None
    assert parse_float("clip", "1,000.5", optional=True) == 1000.5


@pytest.mark.parametrize(
    ("text", "value"), [("124,000,000", 124_000_000), ("7B", 7 * 10**9), ("1_000", 1000)]
)
def test_counts(text, value) -> None:
    from workbench.ui.fields import parse_count

    assert parse_count("parameters", text) == value


def test_a_count_whose_commas_group_nothing_is_refused() -> None:
    from workbench.ui.fields import parse_count

    with pytest.raises(ValueError, match=r"parameters: '1,2,3' is not a count"):
        parse_count("parameters", "1,2,3")


def test_a_count_out_of_range_states_the_range_it_left() -> None:
    """'1e30' parameters is above 10^16: the message gives that bound, not only ">= 1"."""
    from workbench.ui.fields import parse_count

    for text in ("1e30", "0"):
        with pytest.raises(ValueError, match=rf"parameters: '{text}' is out of range; enter a "
                           r"count from 1 to 10\^16"):  # fmt: skip
            parse_count("parameters", text)
