"""The GPU check script (`benchmarks/gpu_check.py`, run on a lent GPU) keeps working: its
every section runs here in `--cpu-smoke` mode (tiny sizes, CUDA-only checks left out), and
without CUDA the real mode fails loudly instead of passing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def test_every_section_runs_in_cpu_smoke_mode(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "cpu-smoke"
    assert set(result["sections"]) == {
        "nvml",
        "session",
        "deepspeed",
        "oom",
        "ranks",
        "speed",
        "ladder",
    }
    assert all("error" not in s for s in result["sections"].values())
    assert result["checks"] and all(c["ok"] for c in result["checks"])


@pytest.mark.cpu_only
def test_without_cuda_the_gpu_check_fails_loudly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "gpu.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "FAILED: torch" in done.stdout and "sees no CUDA GPU" in done.stdout
