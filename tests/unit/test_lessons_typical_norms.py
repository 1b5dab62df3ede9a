"""The advisor's typical gradient norm is the run's before it diverged.

A run that diverges (norms 7.5, then 40, 200, 1000, ... growing each step) spikes against
its running median again and again; the clip the advisor suggests is about twice the
median norm before the first spike, not twice a median the diverged steps pulled up.
"""

from __future__ import annotations

from typing import Any

from workbench.advisor import MIN_SPIKE_BASELINE, advise
from workbench.train.records import StepRecord


def rec(step: int, grad_norm: float) -> StepRecord:
    base: dict[str, Any] = dict(
        step=step,
        micro_steps=1,
        loss=2.0,
        samples_per_s=100.0,
        tokens_per_s=None,
        step_seconds=0.1,
        data_seconds=0.001,
        compute_seconds=0.099,
        lr=1.0,
        grad_norm=grad_norm,
        scale=None,
        skipped=False,
        precision="fp32",
        micro_batch=8,
        grad_accum=1,
        zero_stage=0,
    )
    return StepRecord(**base)


def test_a_diverged_stretch_does_not_raise_the_typical_norm() -> None:
    steady = [7.0, 8.0, 7.5, 7.2, 7.8, 7.4, 7.6, 7.5, 7.3, 7.7, 7.5, 7.6]
    diverged = [40.0 * 5.0**k for k in range(14)]  # each step 5x the last: 40 ... 4.9e10
    norms = steady + diverged
    assert len(steady) >= MIN_SPIKE_BASELINE
    (spike,) = [
        a for a in advise([rec(i + 1, g) for i, g in enumerate(norms)]) if a.id == "grad-norm-spike"
    ]
    assert spike.evidence["grad_norm_median"] == 7.5  # the steady steps' median
    assert spike.apply == {"clip_grad_norm": 15.0}
    assert "clip at 15 (about twice the median norm before the first spike)" in spike.message
