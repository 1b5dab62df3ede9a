"""`workbench export` prints each way to run the job once: an FSDP job runs under torchrun,
so its torchrun command is not repeated as an alternative."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main


@pytest.mark.parametrize("nodes", ["1", "2"])
def test_fsdp_prints_its_torchrun_command_once(
    nodes: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--format", "fsdp", "--fsdp", "full_shard", "--gpus", "2"]
    assert main([*argv, "--nodes", nodes, "--out", str(tmp_path / "job")]) == 0
    out = capsys.readouterr().out
    run = [line.strip() for line in out.splitlines() if "torchrun " in line]
    assert len(run) == 1 and run[0].startswith("torchrun "), out
    assert "or: bash " in out


def test_deepspeed_keeps_its_torchrun_alternative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "--gpus", "2", "--out", str(tmp_path / "job")]) == 0
    out = capsys.readouterr().out
    assert "  deepspeed --num_gpus 2 train_deepspeed.py" in out
    assert "  or: torchrun --standalone --nproc-per-node 2 train_deepspeed.py" in out
