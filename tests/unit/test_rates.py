"""A window's throughput and data share are ratios of sums (`workbench.rates`), and the
advisor's data-stall and precision-speed rules read them so.

Notebook 06 printed "num_workers=2: ... (median 413 samples/s)" for a loader that delivers
at most 200: two workers needing 80 ms a batch hand over batches in pairs, so the steps
alternate between a long wait and almost none, and the median step is a fast one. The
stream below is that run's shape (waits of 65-72 ms and of 1 ms in turn, 16 ms of compute,
as measured on a two-core machine): the median step says 500 samples/s and a 6% wait, the
run delivered 162 samples/s and waited 70% of the time.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

import workbench
from workbench.advisor import MIN_PRECISION_STEPS, STALL_FRACTION, advise
from workbench.rates import throughput
from workbench.train.records import StepRecord

MICRO_BATCH = 8
COMPUTE_S = 0.015


def rec(step: int, data_s: float, compute_s: float = COMPUTE_S, **kw: Any) -> StepRecord:
    step_s = data_s + compute_s
    base: dict[str, Any] = dict(
        step=step,
        micro_steps=1,
        loss=2.0,
        samples_per_s=MICRO_BATCH / step_s,
        tokens_per_s=MICRO_BATCH * 32 / step_s,
        step_seconds=step_s,
        data_seconds=data_s,
        compute_seconds=compute_s,
        lr=3e-4,
        grad_norm=1.0,
        scale=None,
        skipped=False,
        precision="fp32",
        micro_batch=MICRO_BATCH,
        grad_accum=1,
        zero_stage=0,
        num_workers=2,
    )
    base.update(kw)
    return StepRecord(**base)


def bursts(n_fast: int = 15, n_slow: int = 14, start: int = 1, **kw: Any) -> list[StepRecord]:
    """Fast and slow steps in turn, beginning and ending with a fast one: the batch the other
    worker had ready (1 ms), then a wait for the next pair (70 ms)."""
    waits = [0.001 if i % 2 == 0 else 0.070 for i in range(n_fast + n_slow)]
    return [rec(start + i, w, **kw) for i, w in enumerate(waits)]


def test_the_rate_of_a_bursty_window_is_its_samples_over_its_seconds() -> None:
    records = bursts()
    t = throughput(records)
    seconds = 15 * 0.016 + 14 * 0.085
    assert t.steps == 29 and t.seconds == pytest.approx(seconds)
    assert t.samples == pytest.approx(29 * MICRO_BATCH)
    assert t.samples_per_s == pytest.approx(29 * MICRO_BATCH / seconds)  # 162 samples/s
    assert t.tokens_per_s == pytest.approx(29 * MICRO_BATCH * 32 / seconds)
    assert t.data_share == pytest.approx((15 * 0.001 + 14 * 0.070) / seconds)  # 70%
    assert t.step_seconds == pytest.approx(seconds / 29)
    # what the medians said: a fast step's rate and share
    assert statistics.median(r.samples_per_s for r in records) == pytest.approx(500)
    assert t.samples_per_s < 0.35 * 500
    assert statistics.median(r.data_seconds / r.step_seconds for r in records) < 0.07
    assert workbench.throughput is throughput


def test_dicts_count_and_steps_without_time_or_tokens_are_said() -> None:
    t = throughput([{"step_seconds": 0.5, "data_seconds": 0.1, "samples_per_s": 4.0}])
    assert (t.samples, t.samples_per_s, t.data_share, t.tokens) == (2.0, 4.0, 0.2, None)
    none = throughput([{"step_seconds": None}])
    assert none.steps == 0 and none.samples_per_s is None and none.data_share is None


@pytest.mark.parametrize(
    ("records", "match"),
    [
        ("abc", r"records='abc': must be a sequence"),
        ([None], r"records\[0\]=None: must be a StepRecord"),
        ([{"step_seconds": "0.1"}], r"records\[0\]\.step_seconds='0.1': must be a finite number"),
        ([{"step_seconds": 0.1, "data_seconds": float("nan")}], r"data_seconds=nan"),
        ([{"step_seconds": -1.0}], r"records\[0\]\.step_seconds=-1\.0: must be >= 0"),
    ],
)
def test_bad_records_are_named(records: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        throughput(records)


def test_the_stall_rule_sees_the_wait_a_median_step_hides() -> None:
    """The median step waits 1 ms of 16 (6%, under the 20% threshold): the rule said
    nothing. The window waited 70% of its time."""
    records = [rec(1, 0.5)] + bursts(start=2)  # the first step starts the workers
    (a,) = [a for a in advise(records, device="cpu") if a.id == "data-loader-stall"]
    t = throughput(records[1:])
    assert t.data_share is not None and t.data_share > 3 * STALL_FRACTION
    assert a.evidence["data_fraction"] == pytest.approx(t.data_share)
    assert a.evidence["samples_per_s"] == pytest.approx(t.samples_per_s)
    assert a.evidence["steps"] == 29
    assert f"waits for data {t.data_share:.0%} of the time over the last 29 steps" in a.message
    assert f"{t.samples_per_s:.1f} samples/s" in a.message


def test_the_step_of_a_settings_change_and_the_steps_before_it_are_not_the_window() -> None:
    """The stall before `num_workers` changed is history; the change's own step pays for
    starting the new workers. Too few steps since: nothing to say yet; enough: the new
    settings' own share."""
    stalled = [rec(i, 0.3) for i in range(1, 21)]
    change = rec(21, 1.0, changes={"num_workers": 4})
    fine = [rec(22 + i, 0.001) for i in range(10)]
    assert "data-loader-stall" in [a.id for a in advise(stalled, device="cpu")]
    assert "data-loader-stall" not in [a.id for a in advise(stalled + [change], device="cpu")]
    assert "data-loader-stall" not in [a.id for a in advise(stalled + [change] + fine)]


def test_a_precision_whose_median_step_is_fast_but_whose_run_is_slower_is_reported() -> None:
    """amp-bf16 here delivers 89 samples/s in all (its slow steps wait 190 ms), fp32 100:
    the median bf16 step (800 samples/s) made bf16 look 8x faster and the rule kept quiet."""
    n = MIN_PRECISION_STEPS + 2
    fp32 = [rec(1 + i, 0.0, compute_s=0.08) for i in range(n)]
    waits = [0.0] + [0.0 if i % 2 == 0 else 0.18 for i in range(9)]  # the first is dropped
    bf16 = [rec(n + 1 + i, w, compute_s=0.01, precision="amp-bf16") for i, w in enumerate(waits)]
    assert statistics.median(r.samples_per_s for r in bf16[1:]) == pytest.approx(800)
    (a,) = [a for a in advise(fp32 + bf16, device="cpu") if a.id == "precision-slower"]
    assert a.apply == {"precision": "fp32"}
    expected = throughput(bf16[1:]).samples_per_s
    assert a.evidence["samples_per_s"] == pytest.approx({"fp32": 100.0, "amp-bf16": expected})
    assert expected is not None and expected < 0.95 * 100
