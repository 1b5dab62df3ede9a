"""How long an optimizer step took, without making the host wait for the device for it.

A step has one place where the host reads device values (`step.read_device_values`: the
loss and the gradient norm, before the optimizer step), and so one host-device sync. The
clock is built once per device and times the step around that read:

* `HostClock` (CPU): the host runs every kernel itself, so the host's clock between the
  step's start and its end is the step's time.
* `CudaClock` (CUDA): CUDA events on the stream. The step's time is the device's time from
  its start to the read (complete once the read has waited for the device), plus the
  optimizer part of the step before, from the read to its end, read a step late (complete
  by the time this step's read returns). In a steady run this is the step's own time; the
  first step on a new engine (a warm-up step) waits for its own end instead, once.
  Device time includes the gaps where the device waited for the host (a slow loader),
  since an event's time is when the device reaches it.

`start()` as the step begins, `before_read()` just before the read, `stop()` after the
optimizer step: the step's seconds. `reset()` when the engine changes (a rebuild).
"""

from __future__ import annotations

from time import perf_counter

import torch


class HostClock:
    """Step times from the host's clock (the device is the host)."""

    def __init__(self) -> None:
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = perf_counter()

    def before_read(self) -> None:
        """Nothing to mark: the host's clock runs with the step."""

    def stop(self) -> float:
        return perf_counter() - self._t0

    def reset(self) -> None:
        """Nothing carried between steps."""


class CudaClock:
    """Step times from CUDA events, with no host-device sync of their own in a steady run
    (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = torch.cuda.current_stream(device)  # the stream the step runs on
        self._now = self._events()  # this step's (start, read, end)
        self._spare = self._events()  # the previous step's, read at this step's stop
        self._has_before = False

    @staticmethod
    def _events() -> tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]:
        return (
            torch.cuda.Event(enable_timing=True),
            torch.cuda.Event(enable_timing=True),
            torch.cuda.Event(enable_timing=True),
        )

    def start(self) -> None:
        self._now[0].record(self._stream)

    def before_read(self) -> None:
        self._now[1].record(self._stream)

    def stop(self) -> float:
        start, read, end = self._now
        end.record(self._stream)
        if self._has_before:
            # recorded before this step's start, so complete since this step's read
            _, before_read, before_end = self._spare
            tail = before_read.elapsed_time(before_end) / 1e3
        else:
            end.synchronize()  # host waits for the device here: the first step on an engine
            tail = read.elapsed_time(end) / 1e3
        # complete: the read waited for the device after `read` was recorded
        front = start.elapsed_time(read) / 1e3
        self._now, self._spare = self._spare, self._now
        self._has_before = True
        return float(front + tail)

    def reset(self) -> None:
        self._has_before = False


def step_clock(device: torch.device) -> HostClock | CudaClock:
    """The clock of a step on `device`."""
    return CudaClock(device) if device.type == "cuda" else HostClock()
