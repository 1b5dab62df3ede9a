"""The benchmarks read a run's rate as its samples over its seconds (`workbench.throughput`),
never as the median step's rate: gpu_check's session and speed sections (`run_rates`, and
the amp-bf16 speed-up from it), model_parallel's samples/s per run (`run_samples_per_s`),
sharding's step time compared between engines (`step_times`).

The steps below come in the bursts two loader workers deliver (workbench/rates.py): a fast
step (the batch the other worker had ready) and a slow one (a wait for the next pair) in
turn. The median step is a fast one, at 500 samples/s; the run delivered 162.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

from workbench.train.records import StepRecord

ROOT = Path(__file__).resolve().parents[2]
MICRO_BATCH = 8
SEQ = 32
COMPUTE_S = 0.015


def _benchmark(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def rec(step: int, data_s: float) -> StepRecord:
    step_s = data_s + COMPUTE_S
    return StepRecord(
        step=step,
        micro_steps=1,
        loss=2.0,
        samples_per_s=MICRO_BATCH / step_s,
        tokens_per_s=MICRO_BATCH * SEQ / step_s,
        step_seconds=step_s,
        data_seconds=data_s,
        compute_seconds=COMPUTE_S,
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


def bursts(n: int = 29, start: int = 1) -> list[StepRecord]:
    """Fast (1 ms wait) and slow (70 ms wait) steps in turn, a fast one first and last."""
    return [rec(start + i, 0.001 if i % 2 == 0 else 0.070) for i in range(n)]


def steady(n: int, step_s: float, start: int = 1) -> list[StepRecord]:
    return [rec(start + i, step_s - COMPUTE_S) for i in range(n)]


def _seconds(records: list[StepRecord]) -> float:
    return sum(r.step_seconds for r in records)


def test_gpu_check_reads_a_runs_rates_as_samples_and_tokens_over_seconds() -> None:
    run_rates = _benchmark("gpu_check").run_rates
    records = bursts()
    rates = run_rates(records)
    seconds = _seconds(records)  # 15 x 16 ms + 14 x 85 ms
    assert rates["samples_per_s"] == pytest.approx(29 * MICRO_BATCH / seconds)  # 162
    assert rates["tokens_per_s"] == pytest.approx(29 * MICRO_BATCH * SEQ / seconds)
    assert statistics.median(r.samples_per_s for r in records) == pytest.approx(500)
    # the speed section's amp-bf16 speed-up: a steady fp32 run at 40 ms a step (200
    # samples/s) is faster than the bursty one, which its median step put at 2.5x
    fp32 = run_rates(steady(29, 0.040))
    assert rates["samples_per_s"] / fp32["samples_per_s"] == pytest.approx(29 * 0.040 / seconds)
    assert rates["samples_per_s"] < fp32["samples_per_s"]
    # a step without a token rate: not known, not 0
    no_tokens = [*records[:-1], dataclasses.replace(records[-1], tokens_per_s=None)]
    assert run_rates(no_tokens)["tokens_per_s"] is None


def test_model_parallel_reads_a_runs_samples_per_s_over_its_steps_after_the_first() -> None:
    run_samples_per_s = _benchmark("model_parallel").run_samples_per_s
    records = [rec(0, 2.0), *bursts(start=1)]  # a slow first step (warm-up), left out
    got = run_samples_per_s(records)
    assert got == pytest.approx(29 * MICRO_BATCH / _seconds(records[1:]))
    assert got < 0.35 * statistics.median(r.samples_per_s for r in records[1:])


def test_sharding_compares_engines_by_the_mean_step_after_two_warm_up_steps() -> None:
    step_times = _benchmark("sharding").step_times
    warm = [rec(1, 3.0), rec(2, 1.0)]  # left out
    bursty = step_times([*warm, *bursts(start=3)])
    even = step_times([*warm, *steady(29, 0.040, start=3)])
    seconds = _seconds(bursts())
    assert bursty["step_seconds"] == pytest.approx(seconds / 29)
    assert bursty["median_step_seconds"] == pytest.approx(0.016)  # the typical step, beside
    assert even["step_seconds"] == pytest.approx(0.040)
    # the step-time ratio is the inverse of the two runs' samples/s: the bursty run is the
    # slower one (its median step said 0.4x)
    ratio = bursty["step_seconds"] / even["step_seconds"]
    assert ratio == pytest.approx((29 * MICRO_BATCH / 1.16) / (29 * MICRO_BATCH / seconds))
    assert ratio > 1.2
