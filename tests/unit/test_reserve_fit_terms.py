"""The estimate's allocator reserve is the fit benchmarks/reserve_fit.py recorded: its
coefficient, its form and its error are the ones benchmarks/results/reserve_fit.json holds."""

from __future__ import annotations

import json
from pathlib import Path

from workbench import estimate_memory
from workbench.estimate import reserve

ROOT = Path(__file__).resolve().parents[2]
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "reserve_fit.json").read_text())


def test_the_coefficient_is_the_one_the_fit_recorded() -> None:
    assert RESULTS["fit"]["transient_share"] == reserve.TRANSIENT_SHARE
    assert 0 < reserve.TRANSIENT_SHARE < 1


def test_the_recorded_error_is_the_error_of_the_recorded_points() -> None:
    points = RESULTS["points"]
    assert len(points) >= 30
    assert {p["model"] for p in points} >= {"tiny-gpt", "llama", "gpt2"}
    errors = []
    for p in points:
        fitted = reserve.allocator_reserve_from(p["rounding_bytes"], p["transient_bytes"])
        assert abs(fitted - p["fitted_reserve_bytes"]) <= 1
        errors.append(abs(fitted - p["replayed_reserve_bytes"]) / p["reserved_peak_bytes"])
    assert max(errors) <= RESULTS["fit"]["max_error"] + 1e-4
    assert abs(sum(errors) / len(errors) - RESULTS["fit"]["mean_error"]) <= 1e-4


def test_the_reserve_is_the_states_rounding_plus_a_share_of_the_transient_bytes() -> None:
    e = estimate_memory(
        model="llama-3-8b",
        precision="amp-bf16",
        seq_len=8192,
        gpus=8,
        fsdp="full_shard",
        micro_batch=2,
        checkpointing="selective-op",
    )
    assert e.reserve is not None and e.peak is not None
    terms = e.peak.terms
    states = ("parameters", "gradients", "optimizer states")
    transient = sum(v for k, v in terms.items() if k not in states and v > 0)
    assert transient > 0 and e.reserve.rounding_bytes >= 0
    share = RESULTS["fit"]["transient_share"]
    assert e.reserve.allocator_bytes == e.reserve.rounding_bytes + int(share * transient)
    assert e.reserved_peak_bytes == e.peak_bytes + e.reserve.allocator_bytes


def test_the_docs_name_the_fit_and_its_error() -> None:
    source = (ROOT / "workbench" / "estimate" / "reserve.py").read_text()
    assert "benchmarks/reserve_fit.py" in source
    pct = f"{RESULTS['fit']['max_error']:.1%}"
    assert pct in source
    assert pct in (ROOT / "docs" / "estimator.md").read_text()


GIB = 1 << 30
TT = dict(model="llama-3-8b", precision="amp-bf16", fsdp="full_shard", gpus=8, seq_len=8192)
#: docs/estimator.md's torchtitan rows: (marker, settings, measured reserved GiB)
TORCHTITAN = [
    ("torchtitan PR #822", dict(**TT, checkpointing="selective-op"), 49.41),
    (
        "`reshard_after_forward` never",
        dict(**{**TT, "fsdp": "shard_grad_op"}, checkpointing="selective-op"),
        62.18,
    ),
    ("torchtitan POC commit 9dc418a", dict(**TT), 78.38),
    (
        "torchtitan benchmark, Dec 2024",
        dict(**TT, micro_batch=2, checkpointing="selective-op"),
        82.4,
    ),
    (
        "| same | 128 GPUs |",
        dict(**{**TT, "gpus": 128}, micro_batch=2, checkpointing="selective-op"),
        67.0,
    ),
]


def test_the_published_torchtitan_rows_compare_reserved_with_reserved_within_10_percent() -> None:
    """The reserved column recomputed from the estimate's terms and the recorded share
    (not read from `reserved_peak_bytes`), and its difference from the measured figure."""
    text = (ROOT / "docs" / "estimator.md").read_text()
    share = RESULTS["fit"]["transient_share"]
    states = ("parameters", "gradients", "optimizer states")
    for marker, kw, measured in TORCHTITAN:
        line = next(line for line in text.splitlines() if marker in line)
        e = estimate_memory(**kw)
        assert e.reserve is not None and e.peak is not None
        transient = sum(v for k, v in e.peak.terms.items() if k not in states and v > 0)
        reserved = (e.peak_bytes + e.reserve.rounding_bytes + int(share * transient)) / GIB
        assert f"{measured} GiB (reserved" in line
        assert f"| {reserved:.1f} (reserved) |" in line, (marker, reserved, line)
        diff = (reserved - measured) / measured
        assert f"| {diff:+.1%}" in line, (marker, diff, line)
        assert abs(diff) <= 0.10
