"""`workbench plan` says each problem in one line naming the flag, the value and what is
allowed (docs/planner.md): no Python reprs, no "1 nodes", no "dp 16 = 16", no unrelated
GPU suggestions."""

from __future__ import annotations

import pytest

from workbench.cli import main

ARGS = ["plan", "--model", "llama-3-8b", "--seq-len", "4096"]
PREFIX = "workbench plan: error: "


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--pin", "engine=zero3,tp=2"], "--pin engine=zero3,tp=2: the Session does not train "
         "it: tp=2: tensor parallelism trains through PyTorch's tensor-parallel API"),
        (["--model", "llama-3-70b", "--nodes", "8", "--pin", "tp=8,pp=4,dp=2,engine=zero1"],
         "--pin tp=8,pp=4,dp=2,engine=zero1: the Session does not train it: tp=8: "),
        (["--pin", "dp=16"], "--pin dp=16: must divide the 8 GPUs (tp x pp x cp x dp = the "
         "GPUs)"),
        (["--gpus", "8", "--nodes", "2"], "--gpus 8: is 1 node of 8 GPUs, not --nodes 2"),
        (["--gpu", "a100"], "--gpu 'a100': is ambiguous: say which one of a100-40gb, "
         "a100-80gb"),
        (["--headroom", "0.99"], "--model llama-3-8b: none of the 486 setups planned (engine, "
         "layout, micro-batch, recomputation) fits 8 x h100-80gb"),
    ],
)  # fmt: skip
def test_each_refusal_is_one_line(
    extra: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*ARGS, *extra]) == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.startswith(PREFIX + said)
    assert got.err.count("\n") == 1, got.err
    for repr_mark in ("{'", "did you mean"):
        assert repr_mark not in got.err
