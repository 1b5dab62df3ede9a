"""Token counts as `workbench plan` reads them: binary suffixes (4Mi = 2^22) in the one
count reader, a decimal count that is no whole number of sequences answered with the
nearest ones and the binary spelling, and a negative count refused by name."""

from __future__ import annotations

import json
import re

import pytest

from workbench.cli import build_parser, main
from workbench.estimate import parse_count

ARGS = ["plan", "--model", "llama-3-8b", "--seq-len", "4096", "--top", "1"]
PREFIX = "workbench plan: error: "


@pytest.mark.parametrize(
    ("text", "count"),
    [("4Mi", 4 * 2**20), ("4 mi", 4 * 2**20), ("1.5Ki", 1536), ("2Gi", 2 * 2**30),
     ("1Ti", 2**40), ("4M", 4_000_000), ("4Bi", None), ("0.1Ki", None)],
)  # fmt: skip
def test_binary_suffixes_are_counts(text: str, count: int | None) -> None:
    assert parse_count(text) == count


def test_the_helps_global_tokens_example_plans(capsys: pytest.CaptureFixture[str]) -> None:
    parser, _ = build_parser("plan")
    helps = parser._subparsers._group_actions[0].choices["plan"].format_help()  # type: ignore[union-attr]
    example = re.search(r"--global-tokens T\s+or tokens a step \(e\.g\. (\S+)\)", helps)
    assert example is not None
    assert main([*ARGS, "--json", "--global-tokens", example[1]]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch"] == 1024
    assert main([*ARGS, "--json", "--global-tokens", "4Mi"]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch"] == 1024


def test_a_decimal_count_says_the_nearest_sequences_and_the_binary_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*ARGS, "--global-tokens", "4M"]) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}--global-tokens 4M: 4,000,000 tokens is 976.6 sequences of 4096: must be a "
        "whole number of 4096-token sequences (a multiple of --seq-len 4096): use 3,997,696 "
        "(976) or 4,001,792 (977); or 4Mi = 4,194,304 (1024 sequences)\n"
    )


@pytest.mark.parametrize("form", [["--tokens=-1T"], ["--tokens", "-1T"]])
def test_a_negative_token_count_is_refused_naming_the_flag(
    form: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*ARGS, *form]) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}--tokens -1T: must be a count, a finite number > 0 and <= 10^16 (e.g. 1T)\n"
    )
