"""The torch floor for loading checkpoints: past the last `weights_only` advisory.

`torch.load(weights_only=True)` could run code from a crafted file on torch <= 2.5.1
(CVE-2025-32434) and below 2.10 (CVE-2026-24747). `safe_loading_problem` refuses those
versions with the reason; pyproject.toml's floor is the same release.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.version import SAFE_LOADING_TORCH, safe_loading_problem

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("version", "advisories"),
    [
        ("2.5.1", ["CVE-2025-32434", "CVE-2026-24747"]),
        ("2.6.0+cu124", ["CVE-2026-24747"]),
        ("2.9.1", ["CVE-2026-24747"]),
        ("1.13.1", ["CVE-2025-32434", "CVE-2026-24747"]),
    ],
)
def test_a_torch_open_to_an_advisory_is_refused_naming_it(
    version: str, advisories: list[str]
) -> None:
    problem = safe_loading_problem(version)
    assert problem is not None
    assert problem.startswith(f"torch {version}: its weights_only loader can run code")
    assert re.findall(r"CVE-\d{4}-\d+", problem) == advisories
    assert "install torch >= 2.10" in problem


@pytest.mark.parametrize("version", ["2.10.0", "2.10.0a0+git1234", "2.13.0+cpu", "2.14.1"])
def test_a_torch_past_every_advisory_loads(version: str) -> None:
    assert safe_loading_problem(version) is None


def test_an_unreadable_version_is_refused() -> None:
    problem = safe_loading_problem("nightly")
    assert problem is not None and "'nightly': cannot tell its release" in problem


def test_the_installed_torch_is_past_the_floor_and_pyproject_requires_it() -> None:
    assert safe_loading_problem() is None
    assert safe_loading_problem(torch.__version__) is None
    pyproject = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'^\s*"torch>=(\d+)\.(\d+),<3"', pyproject, re.MULTILINE)
    assert floor is not None and (int(floor[1]), int(floor[2])) == SAFE_LOADING_TORCH


def test_the_version_module_imports_no_torch() -> None:
    code = "import sys, workbench.version; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"
