"""The profile's summary states a phase's typical step time: the median, with the range.

In notebook 06 one slow backward step (86.8 ms against a 9.7 ms median) set the mean the
summary showed. The summary shows each labelled phase's median step and its fastest and
slowest; the totals and shares are unchanged.
"""

from __future__ import annotations

import re

import pytest

from workbench import Session, TrainConfig
from workbench.train.measure.profiler import PHASES, ProfileResult

TINY = dict(layers=1, hidden=32, heads=2, seq_len=16, dropout=0.0)


def result(backward: tuple[float, ...]) -> ProfileResult:
    spans = {"data": (0.001,) * 3, "forward": (0.005,) * 3, "backward": backward}
    spans["optimizer"] = (0.002,) * 3
    seconds = {name: sum(s) for name, s in spans.items()} | {"other": 0.0}
    total = sum(seconds.values())
    return ProfileResult(
        steps=3,
        step_seconds=total / 3,
        operators=(),
        table="",
        phase_seconds=seconds,
        phase_shares={k: v / total for k, v in seconds.items()},
        trace_path="t.json",
        memory_by_category=None,
        memory_peak_bytes=None,
        phase_step_seconds=spans,
    )


def test_one_slow_step_does_not_set_the_typical_phase_time() -> None:
    r = result((0.0097, 0.0868, 0.0095))
    assert r.typical_phase_seconds("backward") == (0.0097, 0.0095, 0.0868)
    (row,) = [line for line in str(r).splitlines() if line.strip().startswith("backward")]
    # the median, not the mean (9.7 + 86.8 + 9.5) / 3 = 35.3 ms
    assert re.fullmatch(
        r"\s*backward \(median step; 9\.5 ms to 86\.8 ms\)\s+9\.7 ms\s+\d+%\s*", row
    )
    assert r.typical_phase_seconds("other") is None
    (other,) = [line for line in str(r).splitlines() if line.strip().startswith("other")]
    assert "other (mean per step)" in other


def test_a_profiled_session_records_each_phase_in_every_step() -> None:
    with Session(TrainConfig(micro_batch=2), model_options=TINY) as s:
        r = s.profile(steps=3)
    assert set(r.phase_step_seconds) == set(PHASES)
    for name in PHASES:
        spans = r.phase_step_seconds[name]
        assert len(spans) == 3 and all(t > 0 for t in spans), (name, spans)
        assert sum(spans) == pytest.approx(r.phase_seconds[name], rel=1e-6)
