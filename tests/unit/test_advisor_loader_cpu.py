"""The data-stall advice reads how busy the CPU was while the loop waited.

Notebook 06's loader sleeps (storage, not computation), yet with num_workers=2 on two cores
the advice said "num_workers=2 already uses every CPU core; make the data pipeline
cheaper": the worker count alone was read as a busy CPU. A loader that waits leaves the
cores idle, and more workers than cores overlap its waits (notebook 05). With a Sampler's
readings (on the records, or as `samples=`) the rule tells the two apart; without them it
says both cases and applies nothing past one worker a core.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from workbench.advisor import CPU_SATURATED_PERCENT, advise
from workbench.monitor import Sample
from workbench.train.records import StepRecord

CORES = 2


@pytest.fixture(autouse=True)
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: CORES)


def stalled(
    workers: int, cpu: float | None = None, n: int = 12, t0: float = 1000.0
) -> list[StepRecord]:
    """`n` steps that wait 60 of 75 ms for data with `workers` loader workers, each
    carrying the sampler's CPU reading `cpu` (None: no sampler), 75 ms apart from `t0`."""
    out = []
    for i in range(n):
        out.append(
            StepRecord(
                step=i + 1,
                micro_steps=1,
                loss=2.0,
                samples_per_s=8 / 0.075,
                tokens_per_s=None,
                step_seconds=0.075,
                data_seconds=0.060,
                compute_seconds=0.015,
                lr=1e-3,
                grad_norm=1.0,
                scale=None,
                skipped=False,
                precision="fp32",
                micro_batch=8,
                grad_accum=1,
                zero_stage=0,
                num_workers=workers,
                cpu_util_percent=cpu,
                wall_time=t0 + 0.075 * (i + 1),
            )  # fmt: skip
        )
    return out


def stall(records: list[StepRecord], **kw: Any) -> Any:
    (a,) = [a for a in advise(records, device="cpu", **kw) if a.id == "data-loader-stall"]
    return a


def test_a_waiting_loader_with_a_worker_a_core_is_told_to_add_more() -> None:
    a = stall(stalled(workers=CORES, cpu=30.0))
    assert a.apply == {"num_workers": 2 * CORES}
    assert "every CPU core" not in a.message and "cheaper" not in a.message
    assert f"the CPU is 30% busy over its {CORES} cores, so it has room" in a.message
    assert f"more workers than the {CORES} cores help here" in a.message
    assert a.evidence["cpu_util_percent"] == pytest.approx(30.0)


def test_a_busy_cpu_gets_a_cheaper_pipeline_and_no_more_workers() -> None:
    a = stall(stalled(workers=CORES, cpu=CPU_SATURATED_PERCENT + 10))
    assert a.apply is None
    assert "more loader workers would only share them" in a.message
    assert "pre-tokenize" in a.message
    fewer = stall(stalled(workers=1, cpu=97.0))  # busy even below a worker a core
    assert fewer.apply is None and "97% busy" in fewer.message


def test_the_samples_within_the_window_are_read_when_the_records_carry_none() -> None:
    records = stalled(workers=CORES)  # steps from t=1000.075 to 1000.9
    idle = [Sample(1000.0 + 0.1 * k, "host", (), 25.0, 20.0, None, None, None) for k in range(10)]
    before = [Sample(990.0 + k, "host", (), 100.0, 190.0, None, None, None) for k in range(5)]
    a = stall(records, samples=before + idle)
    assert a.evidence["cpu_util_percent"] == pytest.approx(25.0)  # not the busy ones before
    assert a.apply == {"num_workers": 2 * CORES}
    with pytest.raises(ValueError, match=r"samples\[0\]\.cpu_util_percent='busy'"):
        advise(records, samples=[Sample(1.0, "host", (), "busy", None, None, None, None)])  # type: ignore[arg-type]


def test_without_readings_both_cases_are_said_and_nothing_past_a_worker_a_core_applies() -> None:
    a = stall(stalled(workers=CORES))
    assert a.apply is None
    assert "every CPU core" not in a.message
    assert (
        "if the loader computes" in a.message and "more workers only share the cores" in a.message
    )
    assert (
        f"if it waits on storage or the network, more workers than cores help (try num_workers={2 * CORES})"
        in a.message
    )
    assert "Sampler" in a.message
    below = stall(stalled(workers=0))  # up to a worker a core, as before
    assert below.apply == {"num_workers": CORES}
