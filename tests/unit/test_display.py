"""The readable text and HTML forms of results: units, alignment, escaping."""

from __future__ import annotations

import re

import pytest

from workbench.display import Display, fmt_bytes, fmt_count, fmt_number, fmt_seconds


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"), (3 * 2**30, "3.00 GiB")],
)
def test_bytes_use_binary_units(n: int | None, text: str) -> None:
    assert fmt_bytes(n) == text


def test_seconds_counts_and_numbers() -> None:
    assert [fmt_seconds(s) for s in (2.5, 0.0123, 4e-5, None)] == [
        "2.50 s",
        "12.3 ms",
        "40 µs",
        "n/a",
    ]
    assert [fmt_count(n) for n in (124_439_808, 7.5e9, 950, None)] == [
        "124.4M",
        "7.5B",
        "950",
        "n/a",
    ]
    assert fmt_number(float("nan")) == "nan" and fmt_number(0.000123456) == "0.0001235"


def test_a_table_aligns_numbers_right_and_escapes_html() -> None:
    d = Display("t <1>", [("a", "1 B"), ("long name", "10.00 KiB")], header=("", "bytes"))
    lines = d.text().splitlines()
    assert lines[0] == "t <1>"
    assert lines[3].endswith("      1 B") and lines[4].endswith("10.00 KiB")
    page = d.html()
    assert "t &lt;1&gt;" in page and "<table" in page and "text-align:right" in page


def test_an_estimate_reads_in_units_in_a_terminal_and_a_notebook() -> None:
    from workbench import estimate_memory

    e = estimate_memory(n_params="175B", precision="fp32", optimizer="adamw", gpu="h100-80gb")
    text = str(e)
    assert text.splitlines()[0].startswith("memory per GPU: 175.0B parameters, fp32, adamw")
    assert re.search(r"\n    parameters +651\.93 GiB", text)  # 700e9 bytes
    assert "peak of a step (optimizer step)         3.18 TiB" in text  # + foreach's 4 bytes
    assert "does not fit" in text and "not estimated" in text
    assert "<table" in e._repr_html_() and "651.93 GiB" in e._repr_html_()
    assert repr(e).startswith("MemoryEstimate(")  # the dataclass repr is kept for debugging
