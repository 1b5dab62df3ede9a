"""`workbench plan --export`: the best plan that can be exported is written (saying which,
and why the better ones could not be), the ranking is printed either way, and --tokens sets
the job's steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from workbench.cli import main

# at 2048 tokens with DDP and FSDP, the fastest plans cut pipeline stages (TP 4 x PP 16 with
# DDP first), which the FSDP job does not, and FSDP over 64 is the first it exports
SHAPE = ["plan", "--model", "llama-3-70b", "--gpu", "h100", "--nodes", "8", "--seq-len", "2048",
         "--global-batch", "512", "--top", "6", "--engines", "ddp,full_shard"]  # fmt: skip


def test_export_skips_plans_no_job_carries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job"
    args = [*SHAPE, "--export", str(out), "--export-model", "tiny-gpt", "--tokens", "15T"]
    assert main(args) == 0
    got = capsys.readouterr().out
    assert "  1  ddp tp4 pp16 dp1 mb1x512" in got  # the ranking is printed
    written = [line for line in got.splitlines() if " written to " in line]
    assert len(written) == 1 and written[0].startswith("Plan #5 written to ")
    assert "not #1 (ddp tp4 pp16 dp1 mb1x512): pp=16: not exported to --format fsdp" in got
    steps = math.ceil(15e12 / (512 * 2048))
    assert f"steps: {steps:,} (15,000,000,000,000 tokens / 1,048,576 tokens a step" in got
    job = json.loads((out / "job.json").read_text())
    assert job["steps"] == steps and job["config"]["total_steps"] == steps
    assert job["config"]["fsdp"] == "full_shard" and job["config"]["tp"] == 1


def test_export_with_no_exportable_plan_fails_after_the_ranking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*SHAPE, "--pin", "tp=4,pp=16", "--export", str(tmp_path / "j"),
            "--export-model", "tiny-gpt"]  # fmt: skip
    assert main(args) == 2
    got = capsys.readouterr()
    assert "  1  ddp tp4 pp16 dp1" in got.out
    lines = got.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "--export " in lines[0] and "plans can be exported; #1 (ddp tp4 pp16 dp1" in lines[0]
    assert not (tmp_path / "j").exists()
