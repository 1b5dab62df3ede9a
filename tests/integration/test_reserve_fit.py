"""Grid points of benchmarks/reserve_fit.py dry-run again: the estimate's fitted allocator
reserve is within the fit's recorded error of the reserve the allocator model replays."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from workbench.estimate import reserve

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "reserve_fit.py"
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "reserve_fit.json").read_text())

_spec = importlib.util.spec_from_file_location("reserve_fit", SCRIPT)
assert _spec is not None and _spec.loader is not None
fit_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit_script)

#: cheap grid points: a scaled tiny GPT (fp32 AdamW; amp-bf16 with checkpointing), a Llama
POINTS = [
    p
    for p in fit_script.grid()
    if (p["model"], p["shape"][1], p["precision"], p["checkpointing"])
    in {
        ("tiny-gpt", 384, "fp32", False),
        ("tiny-gpt", 384, "amp-bf16", True),
        ("llama", 256, "fp32", False),
    }
]


def test_the_chosen_points_are_on_the_grid() -> None:
    assert len(POINTS) == 3


@pytest.mark.parametrize("kwargs", POINTS, ids=lambda p: f"{p['model']}-{p['precision']}")
def test_the_fitted_reserve_is_within_the_recorded_error_of_the_replayed_one(kwargs) -> None:
    p = fit_script.point(**kwargs)
    recorded = next(q for q in RESULTS["points"] if all(q[k] == v for k, v in kwargs.items()))
    # the dry run is deterministic: the same trace, the same replay
    assert p["replayed_reserve_bytes"] == recorded["replayed_reserve_bytes"]
    fitted = p["estimate_reserve_bytes"]
    assert fitted == reserve.allocator_reserve_from(p["rounding_bytes"], p["transient_bytes"])
    error = abs(fitted - p["replayed_reserve_bytes"]) / p["reserved_peak_bytes"]
    assert error <= RESULTS["fit"]["max_error"] + 1e-4
