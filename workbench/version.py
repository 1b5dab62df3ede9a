"""The workbench's version (the same as pyproject.toml's), importable from any layer.

Also `safe_loading_problem()`: whether the installed torch's `weights_only` loader, which
every checkpoint read goes through, is past the last advisory that let a crafted file run
code when loaded. This module imports no torch at import time.
"""

from __future__ import annotations

import re

__version__ = "0.1.0"

# Code-execution advisories for `torch.load(..., weights_only=True)`: (advisory, the first
# torch release that fixes it). A checkpoint is loaded only on a torch past all of them.
WEIGHTS_ONLY_ADVISORIES: tuple[tuple[str, tuple[int, int]], ...] = (
    ("CVE-2025-32434", (2, 6)),  # torch <= 2.5.1
    ("CVE-2026-24747", (2, 10)),  # torch < 2.10
)
SAFE_LOADING_TORCH: tuple[int, int] = max(fixed for _, fixed in WEIGHTS_ONLY_ADVISORIES)

_RELEASE = re.compile(r"(\d+)\.(\d+)")


def safe_loading_problem(torch_version: str | None = None) -> str | None:
    """None when torch `torch_version` (default: the installed one) loads a checkpoint with
    no known way for the file to run code; else the reason, naming the advisories that
    torch is open to and the release that fixes them. A pre-release counts as its release
    (`2.10.0a0` as 2.10); a version that cannot be read is refused."""
    if torch_version is None:
        import torch

        torch_version = str(torch.__version__)
    match = _RELEASE.match(torch_version.strip())
    if match is None:
        return (
            f"torch {torch_version!r}: cannot tell its release, so cannot tell whether its "
            f"weights_only loader is past the advisories "
            f"({', '.join(name for name, _ in WEIGHTS_ONLY_ADVISORIES)}); checkpoints are "
            f"loaded only with torch >= {_dotted(SAFE_LOADING_TORCH)}"
        )
    release = (int(match.group(1)), int(match.group(2)))
    open_to = [name for name, fixed in WEIGHTS_ONLY_ADVISORIES if release < fixed]
    if not open_to:
        return None
    return (
        f"torch {torch_version}: its weights_only loader can run code from a crafted file "
        f"({', '.join(open_to)}), so no checkpoint is loaded with it; install torch >= "
        f"{_dotted(SAFE_LOADING_TORCH)} (pip install 'torch>={_dotted(SAFE_LOADING_TORCH)},<3')"
    )


def _dotted(release: tuple[int, int]) -> str:
    return ".".join(str(n) for n in release)
