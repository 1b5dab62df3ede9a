"""`Session.profile()`: torch.profiler around a few real training steps.

Schedule: wait 1 step, warm up 1 step, record `steps` steps (so `steps + 2` optimizer
steps run, and count as training). CPU activity always, CUDA when the session runs on a
GPU. The loop labels its phases with `record_function` ("workbench.data",
"workbench.forward", "workbench.backward", "workbench.optimizer"); their inclusive host
time divided by the recorded steps' time gives the phase shares.

On CUDA the host only launches kernels inside a phase and waits for them later (reading
the loss, the end of the step), outside every labelled range, so a plain host split
would put the GPU time of forward, backward and optimizer in "other". While profiling,
each labelled range therefore ends by waiting for the device (`phase_label`): a phase's
host time then includes the device time of the work it launched. (The backward pass runs
on autograd's own threads, so its kernels are not children of the "workbench.backward"
range in the profiler's event tree; the wait inside the range attributes them anyway.)
The profiled steps run host and device in lock step, so their step time can be a little
above an unprofiled step's.

With `record_memory=True` the profiler also records shapes, memory and stacks, and
torch's memory profiler (`torch.profiler._memory_profiler`, a private API) sorts the
bytes alive at the peak into parameter / gradient / optimizer-state / activation /
temporary / input / autograd-detail / unknown. When that API is missing or fails,
`memory_by_category` is None and `notes` says why.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

from workbench.display import Display, Readable, fmt_bytes, fmt_seconds
from workbench.inputs import shown
from workbench.train.records import StepRecord

PHASES = ("data", "forward", "backward", "optimizer")


class ProfiledSession(Protocol):
    """What the profiler uses of a `workbench.Session` (its public methods only)."""

    id: str
    device: torch.device

    @property
    def step(self) -> int: ...

    def on_record(self, callback: Callable[[StepRecord], None]) -> Callable[[], None]: ...

    def phase_labels(
        self, label: Callable[[str], AbstractContextManager[Any]]
    ) -> AbstractContextManager[None]: ...

    def run(self, optimizer_steps: int, *, progress: bool | None = None) -> list[StepRecord]: ...


def check_profile_args(steps: Any, record_memory: Any) -> None:
    """ValueError unless `steps` is an integer >= 1 and `record_memory` a bool."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 10**6:
        raise ValueError(
            f"steps={shown(steps)}: must be an integer from 1 to 10^6 (a profile keeps every "
            "step's operators in memory)"
        )
    if not isinstance(record_memory, bool):
        raise ValueError(f"record_memory={shown(record_memory)}: must be True or False")


@dataclass(frozen=True)
class OperatorRow:
    name: str
    calls: int
    self_cpu_seconds: float
    cpu_total_seconds: float
    self_device_seconds: float | None  # CUDA self time, None on CPU


@dataclass(frozen=True)
class ProfileResult(Readable):
    """What `Session.profile()` found. `phase_shares` maps data / forward / backward /
    optimizer / other to shares of the recorded steps' host time (summing to 1).
    `phase_seconds` holds each phase's total over the recorded steps; `phase_step_seconds`
    each labelled phase's time in every recorded step, in order, so one slow step (a
    one-off allocation, a thread the OS descheduled) shows as what it is: the summary
    gives the median step and the range, not a mean that one outlier sets."""

    steps: int
    step_seconds: float  # mean host time of a recorded step
    operators: tuple[OperatorRow, ...]  # top operators by self time
    table: str  # torch's key_averages table, same order
    phase_seconds: dict[str, float]
    phase_shares: dict[str, float]
    trace_path: str
    memory_by_category: dict[str, int] | None  # bytes at the peak, per category
    memory_peak_bytes: int | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    phase_step_seconds: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def typical_phase_seconds(self, name: str) -> tuple[float, float, float] | None:
        """(median, fastest, slowest) time of phase `name` over the recorded steps; None
        when its time per step was not recorded ("other" is only a remainder)."""
        spans = self.phase_step_seconds.get(name)
        if not spans:
            return None
        return statistics.median(spans), min(spans), max(spans)

    def _display(self) -> Display:
        """Two kinds of rows, each time in its own column: the phases (the time inside each
        label, the operators it ran included: the median step with the range, the total
        over the recorded steps and its share), then the top operators (self time: inside
        the operator itself, not the ops it called; their total over the recorded steps,
        its share, the calls). `table` has torch's full table."""
        n = self.steps
        total_s = self.step_seconds * n
        rows: list[tuple[str, ...]] = [
            ("phases (inclusive: every op inside the label)", "", "", "", "")
        ]
        for name, share in self.phase_shares.items():
            typical = self.typical_phase_seconds(name)
            if typical is None:
                label, median_text = f"  {name} (outside the labels)", ""
            else:
                median, low, high = typical
                label = f"  {name} ({fmt_seconds(low)} to {fmt_seconds(high)})"
                median_text = fmt_seconds(median)
            seconds = self.phase_seconds.get(name, 0.0)
            rows.append((label, median_text, fmt_seconds(seconds), f"{share:.0%}", ""))
        device = any(op.self_device_seconds is not None for op in self.operators)
        kind = "device" if device else "CPU"
        rows.append((f"operators (self {kind} time: inside the op itself)", "", "", "", ""))
        for op in self.operators[:10]:
            self_time = (op.self_device_seconds if device else op.self_cpu_seconds) or 0.0
            share_text = f"{self_time / total_s:.0%}" if total_s > 0 else ""
            rows.append(
                (f"  {op.name[:46]}", "", fmt_seconds(self_time), share_text, str(op.calls))
            )
        if self.memory_peak_bytes is not None:
            rows.append(("memory peak", "", fmt_bytes(self.memory_peak_bytes), "", ""))
        title = (
            f"profile: {n} steps, {fmt_seconds(self.step_seconds)} per step (mean); "
            f"trace {self.trace_path}"
        )
        header = ("", "median step", f"total, {n} steps", "share", "calls")
        return Display(title, rows, header=header, notes=self.notes)


def phase_label(device: torch.device) -> Callable[[str], AbstractContextManager[Any]]:
    """The label the loop's phases get while profiling: `record_function(name)`, and on
    CUDA a wait for the device before the range closes, so the phase's range covers the
    device time of what it launched (see the module docstring)."""
    if device.type != "cuda":
        return record_function

    @contextlib.contextmanager
    def label(name: str) -> Iterator[None]:
        with record_function(name):
            yield
            torch.cuda.synchronize(device)

    return label


def _memory_split(
    prof: Any, device: torch.device
) -> tuple[dict[str, int] | None, int | None, str | None]:
    try:
        from torch.profiler import _memory_profiler as mp

        timeline = mp.MemoryProfileTimeline(prof._memory_profile())
        times, sizes = timeline._coalesce_timeline(str(device))
        names = ["unknown_0"] + [
            (c.name.lower() if c is not None else "unknown") for c in mp._CATEGORY_TO_COLORS
        ]
    except Exception as exc:  # private API: absent or changed in this torch version
        return None, None, f"memory split not available from torch {torch.__version__}: {exc}"
    if not sizes:
        return None, None, "the memory profiler recorded no allocations on this device"
    peak = max(sizes, key=sum)
    split: dict[str, int] = {}
    for name, value in zip(names, peak, strict=False):
        key = "unknown" if name.startswith("unknown") else name
        split[key] = split.get(key, 0) + int(value)
    return split, int(sum(peak)), None


def profile_session(
    session: ProfiledSession,
    *,
    steps: int,
    record_memory: bool,
    trace_path: str | os.PathLike[str] | None,
) -> ProfileResult:
    cuda = session.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if trace_path is None:
        trace_path = Path(tempfile.gettempdir()) / (
            f"workbench-{session.id}-step{session.step}-{int(time.time())}.trace.json"
        )
    trace = Path(trace_path)
    trace.parent.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    def on_ready(p: Any) -> None:
        p.export_chrome_trace(str(trace))
        written.append(str(trace))

    prof = profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=record_memory,
        profile_memory=record_memory,
        with_stack=record_memory,
    )
    remove = session.on_record(lambda _record: prof.step())
    try:
        with prof, session.phase_labels(phase_label(session.device)):
            session.run(steps + 2, progress=False)
    finally:
        remove()

    events = prof.key_averages()
    by_name = {e.key: e for e in events}
    us = 1e-6
    step_total = sum(e.cpu_time_total for e in events if e.key.startswith("ProfilerStep"))
    phase_seconds = {
        name: (
            by_name[f"workbench.{name}"].cpu_time_total * us
            if f"workbench.{name}" in by_name
            else 0.0
        )
        for name in PHASES
    }
    per_step: dict[str, list[float]] = {name: [] for name in PHASES}
    for e in prof.events():
        if e.name.startswith("workbench.") and e.name[len("workbench.") :] in per_step:
            per_step[e.name[len("workbench.") :]].append(e.cpu_time_total * us)
    total_s = step_total * us if step_total else sum(phase_seconds.values())
    phase_seconds["other"] = max(0.0, total_s - sum(phase_seconds.values()))
    shares = {k: (v / total_s if total_s > 0 else 0.0) for k, v in phase_seconds.items()}

    def self_device(e: Any) -> float | None:
        return float(getattr(e, "self_device_time_total", 0.0)) * us if cuda else None

    ops = [
        e
        for e in events
        if not e.key.startswith(("ProfilerStep", "workbench.")) and e.self_cpu_time_total > 0
    ]
    sort_key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops.sort(key=lambda e: getattr(e, sort_key, 0.0), reverse=True)
    rows = tuple(
        OperatorRow(
            name=e.key,
            calls=int(e.count),
            self_cpu_seconds=e.self_cpu_time_total * us,
            cpu_total_seconds=e.cpu_time_total * us,
            self_device_seconds=self_device(e),
        )
        for e in ops[:20]
    )
    notes: list[str] = []
    split = peak = None
    if record_memory:
        split, peak, note = _memory_split(prof, session.device)
        if note:
            notes.append(note)
    else:
        notes.append("record_memory=False: no memory split")
    if not written:
        notes.append("the profiler produced no trace (no steps were recorded)")
    return ProfileResult(
        steps=steps,
        step_seconds=total_s / steps,
        operators=rows,
        table=events.table(sort_by=sort_key, row_limit=20),
        phase_seconds=phase_seconds,
        phase_shares=shares,
        trace_path=written[0] if written else str(trace),
        memory_by_category=split,
        memory_peak_bytes=peak,
        notes=tuple(notes),
        phase_step_seconds={name: tuple(spans) for name, spans in per_step.items() if spans},
    )
