"""`workbench estimate --weight-decay`: the estimator's weight decay (0 by default, a
Session's 0.01) given on the command line, as estimate_memory takes it."""

from __future__ import annotations

import json

import pytest

from workbench import estimate_memory
from workbench.cli import main


def test_the_flag_reaches_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "--params", "1e8", "--optimizer", "sgd", "--json"]
    assert main([*args, "--weight-decay", "0.01"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    default = json.loads(capsys.readouterr().out)
    expected = estimate_memory(n_params=1e8, optimizer="sgd", weight_decay=0.01)
    assert given["peak_bytes"] == expected.peak_bytes > default["peak_bytes"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--weight-decay", "-1"])
    assert info.value.code == 2
    assert "--weight-decay -1: must be a finite number from 0 to" in capsys.readouterr().err
