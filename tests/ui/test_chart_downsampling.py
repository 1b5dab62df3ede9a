"""Charts on long runs: a downsampled series keeps every spike in bounded points, and the
training panel draws the whole run from bounded memory."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ui_fakes import FakeSession

from workbench.train.history import History
from workbench.train.records import StepRecord
from workbench.ui import TrainingPanel
from workbench.ui.charts import Downsampled


def test_a_short_series_is_drawn_as_given() -> None:
    s = Downsampled(buckets=10)
    for x, y in enumerate([3.0, 1.0, math.nan, 2.0, None, 5.0]):
        s.append(x, y)
    assert s.points() == ([0, 1, 3, 5], [3.0, 1.0, 2.0, 5.0])  # NaN / None: no point
    assert s.count == 4


def test_a_million_points_become_a_bounded_few_with_the_spikes() -> None:
    rng = random.Random(1)
    s = Downsampled()
    for x in range(1, 1_000_001):
        y = 1.0 + rng.random() * 0.01
        if x == 123_457:
            y = 40.0  # one step's spike
        if x == 876_543:
            y = -7.0  # one step's dip
        s.append(x, y)
    xs, ys = s.points()
    assert len(xs) <= 1001 and xs[-1] == 1_000_000
    assert xs == sorted(xs) and xs[0] <= 2 * s.stride
    assert (123_457, 40.0) in zip(xs, ys, strict=True) and (876_543, -7.0) in zip(
        xs, ys, strict=True
    )


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300),
    st.integers(2, 8),
)
def test_every_bucket_keeps_its_lowest_and_highest(values: list[float], buckets: int) -> None:
    s = Downsampled(buckets=buckets)
    for x, y in enumerate(values):
        s.append(x, y)
    xs, ys = s.points()
    assert len(xs) <= 2 * (buckets + 1) + 1 and xs == sorted(set(xs)) and xs[-1] == len(values) - 1
    assert all(values[int(x)] == y for x, y in zip(xs, ys, strict=True))
    assert min(ys) == min(values) and max(ys) == max(values)
    # each window of `stride` inputs that a bucket covers shows its extremes
    for start in range(0, len(values) - s.stride + 1, s.stride):
        window = values[start : start + s.stride]
        inside = [y for x, y in zip(xs, ys, strict=True) if start <= x < start + s.stride]
        assert min(inside) == min(window) and max(inside) == max(window)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=500),
    st.integers(2, 40),
)
def test_a_point_budget_keeps_the_extremes(values: list[float], limit: int) -> None:
    s = Downsampled(buckets=64)
    for x, y in enumerate(values):
        s.append(x, y)
    xs, ys = s.points(limit)
    assert len(xs) <= limit + 1 and xs == sorted(set(xs)) and xs[-1] == len(values) - 1
    assert all(values[int(x)] == y for x, y in zip(xs, ys, strict=True))
    assert min(ys) == min(values) and max(ys) == max(values)


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=500))
def test_the_upper_envelope_holds_every_bins_highest(values: list[float]) -> None:
    s = Downsampled(buckets=16)
    for x, y in enumerate(values):
        s.append(x, y)
    xs, ys = s.highs(limit=5)
    assert len(xs) <= 6 and xs == sorted(set(xs)) and xs[-1] == len(values) - 1
    assert all(values[int(x)] == y for x, y in zip(xs, ys, strict=True))
    assert max(ys) == max(values)


def test_the_points_drawn_do_not_grow_with_the_run() -> None:
    s, undrawn = Downsampled(), Downsampled()
    counts = {}
    for x in range(1, 1_000_001):
        y = math.sin(x / 977) + (x % 13) * 1e-3
        s.append(x, y)
        undrawn.append(x, y)
        if x in (1_000, 10_000, 100_000, 1_000_000):
            counts[x] = len(s.points()[0])
        elif x % 997 == 0:
            s.points()  # redraws in between (the drawn buckets are cached as they close)
    assert all(990 <= c <= 1001 for c in counts.values()), counts
    assert s.points() == undrawn.points() and s.highs() == undrawn.highs()


def test_bad_bucket_count() -> None:
    with pytest.raises(ValueError, match="buckets=1: must be an integer >= 2"):
        Downsampled(buckets=1)


def _record(step: int, loss: float) -> StepRecord:
    return StepRecord(
        step=step,
        micro_steps=1,
        loss=loss,
        samples_per_s=100.0,
        tokens_per_s=None,
        step_seconds=0.01,
        data_seconds=0.001,
        compute_seconds=0.009,
        lr=1e-3,
        grad_norm=1.0,
        scale=None,
        skipped=False,
        precision="fp32",
        micro_batch=8,
        grad_accum=1,
        zero_stage=0,
        params_bytes=4000,
        grads_bytes=4000,
        optimizer_bytes=8000,
    )


class LongSession(FakeSession):
    """The fake session with a Session's bounded history and records_since cursor."""

    def __init__(self) -> None:
        super().__init__()
        self.history: Any = History()

    def records_since(self, i: int) -> list[StepRecord]:
        return self.history.since(i)

    def add(self, n: int, spikes: dict[int, float]) -> None:
        start = self.history.total + 1
        for step in range(start, start + n):
            self.history.append(_record(step, spikes.get(step, 1.0 + (step % 7) * 1e-3)))


def test_the_panel_draws_a_long_run_from_bounded_memory() -> None:
    session = LongSession()
    panel = TrainingPanel(session, autostart=False, measure_memory=False)
    try:
        spikes = {777: 30.0, 45_678: 50.0, 99_000: -2.0}
        for _ in range(25):  # the panel keeps up: every record reaches the charts once
            session.add(2_000, spikes)
            panel.refresh(draw_now=True)
        assert panel.series["loss"].count == 50_000
        session.add(50_000, spikes)  # the panel falls behind by more than the history keeps
        panel.refresh(draw_now=True)
        data = panel.chart_data()
        assert len(data["steps"]) <= 1001
        assert data["steps"] == sorted(set(data["steps"]))  # nothing twice after catching up
        assert data["steps"][-1] == 100_000 and data["steps"][0] <= panel.series["loss"].stride
        for step, loss in spikes.items():
            assert (step, loss) in zip(data["steps"], data["loss"], strict=True)
        assert len(panel.records) <= 500 and panel.records[-1].step == 100_000
        assert "step 100000" in panel.status_text
        session.add(3, {})
        panel.refresh(draw_now=True)
        assert panel.chart_data()["steps"][-1] == 100_003
    finally:
        panel.close()
