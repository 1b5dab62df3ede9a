"""Small helpers shared by the benchmarks: timing, machine info, writing results JSON.

    from _common import machine_info, time_call, write_results

Benchmarks are scripts, not tests: run them with `.venv/bin/python benchmarks/NAME.py`.
Importing this module also puts the repository root on `sys.path`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine_info() -> dict[str, Any]:
    """Python, torch (if importable, without importing it when absent), CPUs, platform."""
    torch_version: str | None = None
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            torch_version = version("torch")  # reads metadata; does not import torch
        except PackageNotFoundError:
            torch_version = None
    except ImportError:  # pragma: no cover
        torch_version = None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "torch": torch_version,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
    }


def time_call(
    fn: Callable[[], Any], *, repeat: int = 7, min_seconds: float = 0.2
) -> dict[str, float]:
    """Seconds per call of `fn`: calls are batched until a batch lasts `min_seconds`, then
    `repeat` batches are timed. Returns median/min/max seconds per call and the batch size."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds or number >= 1 << 24:
            break
        number *= 2 if elapsed <= 0 else max(2, min(10, int(min_seconds / elapsed) + 1))
    per_call = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        per_call.append((time.perf_counter() - start) / number)
    return {
        "median_seconds": statistics.median(per_call),
        "min_seconds": min(per_call),
        "max_seconds": max(per_call),
        "calls_per_batch": float(number),
        "batches": float(repeat),
    }


def median_wall(fn: Callable[[], Any], *, runs: int = 7) -> dict[str, float]:
    """Median/min/max wall seconds of `runs` single calls (for slow things: subprocesses)."""
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
    return {
        "median_seconds": statistics.median(walls),
        "min_seconds": min(walls),
        "max_seconds": max(walls),
        "runs": float(runs),
    }


def write_results(name: str, results: dict[str, Any], path: str | Path | None = None) -> Path:
    """Write `results` plus machine info and a UTC timestamp to benchmarks/results/NAME.json
    (or to `path`)."""
    path = RESULTS_DIR / f"{name}.json" if path is None else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **results,
    }
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def positive_int(flag: str) -> Callable[[str], int]:
    """An argparse `type` accepting integers >= 1; the error names the flag and the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: must be an integer >= 1")
        return value

    return parse
