"""History: bounded memory, the records_since cursor, extremes kept when thinning."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.train.history import History, Recent
from workbench.train.records import StepRecord


def rec(step: int, loss: float = 1.0) -> StepRecord:
    return StepRecord(
        step=step,
        micro_steps=1,
        loss=loss,
        samples_per_s=10.0,
        tokens_per_s=None,
        step_seconds=0.1,
        data_seconds=0.01,
        compute_seconds=0.09,
        lr=1e-3,
        grad_norm=None,
        scale=None,
        skipped=False,
        precision="fp32",
        micro_batch=2,
        grad_accum=1,
        zero_stage=0,
    )


def test_a_short_run_is_a_plain_list_of_its_records() -> None:
    records = [rec(i) for i in range(1, 6)]
    h = History(records)
    assert len(h) == h.total == 5 and h.thinned == 0
    assert [r.step for r in h] == [1, 2, 3, 4, 5]
    assert h[-1].step == 5 and h[0].step == 1 and [r.step for r in h[-2:]] == [4, 5]
    assert [r.step for r in h.since(3)] == [4, 5] and h.since(5) == [] and h.since(9) == []
    assert h == records and h != records[:4]
    assert h.to_dicts()[0]["step"] == 1
    with pytest.raises(IndexError):
        h[5]


def test_memory_is_bounded_and_the_newest_stay_at_full_resolution() -> None:
    h = History(recent=100, buckets=16)
    for i in range(1, 100_001):
        h.append(rec(i, loss=1.0))
    assert h.total == 100_000
    assert len(h) <= 100 + 2 * 17  # the newest 100, two per bucket (+ the open one)
    assert [r.step for r in h[-100:]] == list(range(99_901, 100_001))
    steps = [r.step for r in h]
    assert steps == sorted(steps) and steps[0] <= h.stride  # the run's start is still there
    assert h.stride >= (100_000 - 100) // 17


def test_thinning_keeps_every_spike_and_nan_of_the_loss() -> None:
    rng = random.Random(0)
    h = History(recent=50, buckets=8)
    spikes = {1234: 50.0, 4321: -3.0, 7777: math.nan}
    for i in range(1, 10_001):
        h.append(rec(i, loss=spikes.get(i, 1.0 + rng.random() * 0.1)))
    kept = {r.step: r.loss for r in h}
    assert kept[1234] == 50.0 and kept[4321] == -3.0 and math.isnan(kept[7777])


def test_since_is_a_cursor_over_everything_published() -> None:
    """A reader that follows `since(total seen)` sees every record while it keeps up, and
    what is kept of the rest when it falls behind."""
    h = History(recent=10, buckets=4)
    seen: list[int] = []
    for i in range(1, 40):
        h.append(rec(i))
        if i % 3 == 0:
            seen += [r.step for r in h.since(len(seen))]
    assert seen == list(range(1, 40))
    behind = h.since(0)
    assert [r.step for r in behind] == [r.step for r in h]
    assert [r.step for r in h.since(h.total - 2)] == [38, 39]


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=400))
def test_thinned_history_is_ordered_and_holds_the_extremes(losses: list[float]) -> None:
    h = History(recent=5, buckets=3)
    for i, loss in enumerate(losses, 1):
        h.append(rec(i, loss))
    steps = [r.step for r in h]
    assert steps == sorted(set(steps)) and steps[-min(5, len(losses)) :] == list(
        range(len(losses) - min(5, len(losses)) + 1, len(losses) + 1)
    )
    finite = [x for x in losses if math.isfinite(x)]
    kept = [r.loss for r in h]
    if len(finite) == len(losses):
        assert min(kept) == min(finite) and max(kept) == max(finite)
    else:  # a NaN or an infinity outranks every finite loss: one of them is kept
        assert any(not math.isfinite(x) for x in kept)
        if finite:  # and the lowest finite loss (the best the run reached) survives too
            assert min(x for x in kept if math.isfinite(x)) == min(finite)
    assert len(h) <= 5 + 2 * 4


def test_bad_limits_and_cursors() -> None:
    with pytest.raises(ValueError, match="recent=0: must be an integer >= 1"):
        History(recent=0)
    with pytest.raises(ValueError, match="index=-1"):
        History().since(-1)


def test_recent_keeps_the_newest_with_the_same_cursor() -> None:
    r = Recent(3)
    for i in range(5):
        r.append(i)
    assert list(r) == [2, 3, 4] and r.total == 5 and r[-1] == 4 and r == [2, 3, 4]
    assert r.since(0) == [2, 3, 4] and r.since(4) == [4] and r.since(5) == []
    assert Recent() == []
