"""The step clock: CUDA events read a step late, no sync of their own after the first step.

Run on the CPU with fake events that keep a device timeline: an event's time is set when
it is recorded, and `elapsed_time` refuses an event the device has not reached (as CUDA
does), so the test sees which events the clock reads and when it waits.
"""

from __future__ import annotations

import pytest
import torch

from workbench.train.measure import step_clock
from workbench.train.measure.step_clock import CudaClock, HostClock


class FakeEvent:
    """A CUDA event on a fake timeline (`now` ms); complete once `done_up_to` passed it."""

    timeline = {"now": 0.0, "done_up_to": 0.0, "syncs": 0}

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self, stream: object = None) -> None:
        self.at = self.timeline["now"]

    def synchronize(self) -> None:
        self.timeline["syncs"] += 1
        self.timeline["done_up_to"] = max(self.timeline["done_up_to"], self.at or 0.0)

    def elapsed_time(self, end: FakeEvent) -> float:
        for e in (self, end):
            if e.at is None or e.at > self.timeline["done_up_to"]:
                raise RuntimeError("event not complete")
        return end.at - self.at  # type: ignore[operator]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict:
    FakeEvent.timeline.update(now=0.0, done_up_to=0.0, syncs=0)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: object())
    return FakeEvent.timeline


def _step(clock: CudaClock, t: dict, front_ms: float, optimizer_ms: float) -> float:
    """One step: start, forward/backward (front), the read (the device catches up), the
    optimizer (queued, not waited for), stop."""
    clock.start()
    t["now"] += front_ms
    clock.before_read()
    t["done_up_to"] = t["now"]  # the read: the host waited for the device up to here
    t["now"] += optimizer_ms
    return clock.stop()


def test_the_first_step_waits_once_later_steps_read_the_step_before(fake_cuda: dict) -> None:
    clock = CudaClock(torch.device("cuda", 0))
    first = _step(clock, fake_cuda, front_ms=3.0, optimizer_ms=1.0)
    assert first == pytest.approx(4e-3) and fake_cuda["syncs"] == 1
    seconds = [_step(clock, fake_cuda, 3.0, 1.0) for _ in range(5)]
    assert fake_cuda["syncs"] == 1  # no wait of its own after the first step
    assert seconds == pytest.approx([4e-3] * 5)  # a steady step's own time


def test_the_optimizer_part_comes_from_the_step_before(fake_cuda: dict) -> None:
    clock = CudaClock(torch.device("cuda", 0))
    _step(clock, fake_cuda, 2.0, 5.0)
    second = _step(clock, fake_cuda, 2.0, 1.0)  # its optimizer part is not complete yet
    assert second == pytest.approx((2.0 + 5.0) * 1e-3)
    third = _step(clock, fake_cuda, 2.0, 1.0)
    assert third == pytest.approx((2.0 + 1.0) * 1e-3)


def test_a_new_engine_waits_once_again(fake_cuda: dict) -> None:
    clock = CudaClock(torch.device("cuda", 0))
    for _ in range(3):
        _step(clock, fake_cuda, 1.0, 1.0)
    clock.reset()
    _step(clock, fake_cuda, 1.0, 1.0)
    assert fake_cuda["syncs"] == 2


def test_a_failed_step_leaves_the_last_completed_steps_events(fake_cuda: dict) -> None:
    clock = CudaClock(torch.device("cuda", 0))
    _step(clock, fake_cuda, 1.0, 2.0)
    clock.start()  # a step that fails after its read (a NaN loss): no stop
    fake_cuda["now"] += 1.0
    clock.before_read()
    fake_cuda["done_up_to"] = fake_cuda["now"]
    assert _step(clock, fake_cuda, 1.0, 0.5) == pytest.approx((1.0 + 2.0) * 1e-3)
    assert fake_cuda["syncs"] == 1


def test_the_clock_of_each_device() -> None:
    assert isinstance(step_clock.step_clock(torch.device("cpu")), HostClock)
    clock = HostClock()
    clock.start()
    clock.before_read()
    assert clock.stop() >= 0.0
