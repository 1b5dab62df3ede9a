"""`workbench launch --print-command` runs nothing, so it prints the commands for any number
of ranks and any device (a laptop preparing a GPU job); a real run keeps this machine's
limits (cores, GPUs)."""

from __future__ import annotations

import os

import pytest

from workbench.cli.launch import main


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_print_command_is_not_limited_by_this_machine(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks = (os.cpu_count() or 1) + 2  # more than this machine's cores (and its GPUs)
    argv = ["--ranks", str(ranks), "--launcher", "deepspeed", "--device", device]
    assert main([*argv, "--print-command"]) == 0
    out = capsys.readouterr().out
    assert f"deepspeed --num_gpus {ranks} --module workbench.train.launch.rank_worker" in out


def test_a_run_keeps_the_core_limit(capsys: pytest.CaptureFixture[str]) -> None:
    cores = os.cpu_count() or 1
    with pytest.raises(SystemExit) as info:
        main(["--ranks", str(cores + 2), "--device", "cpu", "--steps", "1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--ranks {cores + 2}: this machine has {cores} CPU core(s)" in err


def test_print_command_still_checks_the_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--ranks", "0", "--device", "cpu", "--print-command"])
    assert info.value.code == 2
    assert "--ranks 0: must be an integer >= 1" in capsys.readouterr().err
