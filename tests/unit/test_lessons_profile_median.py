"""The profile's summary states a phase's typical step time: the median, with the range.

In notebook 06 one slow backward step (86.8 ms against a 9.7 ms median) set the mean the
summary showed. The summary shows each labelled phase's median step and its fastest and
slowest; the totals and shares are unchanged.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from workbench import Session, TrainConfig
from workbench.train.measure.profiler import PHASES, OperatorRow, ProfileResult

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
    # the median, not the mean (9.7 + 86.8 + 9.5) / 3 = 35.3 ms; the total in its own column
    assert re.fullmatch(r"\s*backward \(9\.5 ms to 86\.8 ms\)\s+9\.7 ms\s+106\.0 ms\s+\d+%\s*", row)
    assert r.typical_phase_seconds("other") is None
    (other,) = [line for line in str(r).splitlines() if line.strip().startswith("other")]
    assert "other (outside the labels)" in other


def test_per_step_and_total_times_are_in_columns_of_their_own() -> None:
    """Notebook 06's table put a phase's median step ("forward 3.7 ms") and an operator's
    total over the recorded steps ("aten::mm 3.7 ms") in one column headed "self CPU time";
    a phase's time is not a self time at all. Each kind of row is headed now, each figure in
    its own column, and an operator's self time has its share of the recorded steps."""
    r = dataclasses.replace(
        result((0.0097, 0.0868, 0.0095)),
        operators=(OperatorRow("aten::mm", 57, 0.0037, 0.0037, None),),
    )
    lines = str(r).splitlines()
    header = lines[1].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "median step", "total, 3 steps", "share", "calls"
    ]  # fmt: skip
    assert "per step (mean)" in lines[0]
    assert any(line.strip().startswith("phases (inclusive") for line in lines)
    assert any(line.strip().startswith("operators (self CPU time") for line in lines)
    (mm,) = [line for line in lines if "aten::mm" in line]
    share = 0.0037 / (r.step_seconds * 3)
    assert re.fullmatch(rf"\s*aten::mm\s+3\.7 ms\s+{share:.0%}\s+57\s*", mm)
    (forward,) = [line for line in lines if line.strip().startswith("forward")]
    assert re.fullmatch(
        r"\s*forward \(5\.0 ms to 5\.0 ms\)\s+5\.0 ms\s+15\.0 ms\s+\d+%\s*", forward
    )


def test_a_profiled_session_records_each_phase_in_every_step() -> None:
    with Session(TrainConfig(micro_batch=2), model_options=TINY) as s:
        r = s.profile(steps=3)
    assert set(r.phase_step_seconds) == set(PHASES)
    for name in PHASES:
        spans = r.phase_step_seconds[name]
        assert len(spans) == 3 and all(t > 0 for t in spans), (name, spans)
        assert sum(spans) == pytest.approx(r.phase_seconds[name], rel=1e-6)
