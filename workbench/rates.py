"""A run's throughput and data share over a window of step records: ratios of sums.

    t = throughput(session.history)     # StepRecords (or dicts of their fields)
    t.samples_per_s, t.data_share       # all samples / all seconds, all wait / all seconds

A window's rate is its samples over its seconds, never the median (or the mean) of each
step's own rate. With loader workers the batches arrive in bursts: two workers that need
80 ms a batch hand over two batches every 80 ms, so the steps alternate between a long wait
and almost none. The median step is then one of the fast ones, and its rate (and its data
share) is one the run never sustains. The total over the window is what it delivered. The
median stays right where a *typical step time* is the question (the profiler's phases: one
slow step should not set it), not for a rate or a share.

A live rate (a panel's status line) is read the same way over `recent(records)`: the last
`RECENT_STEPS` steps, or the steps since the last settings change when fewer, so that it
follows a change without mixing in the rate from before it.

Pure Python. A record is a `StepRecord` or a dict of its fields: `step_seconds` and
`data_seconds`, `samples_per_s` and `tokens_per_s` (a step's samples are its rate x its
seconds, as the step computed the rate), and for `recent` its `changes` and `warmup`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.inputs import shown


@dataclass(frozen=True)
class Throughput:
    """What `steps` step records delivered in all: their samples (and tokens, None when a
    record has no token rate) over their `seconds`, of which `data_seconds` were waits for
    the data loader."""

    steps: int
    samples: float
    tokens: float | None
    seconds: float
    data_seconds: float

    @property
    def samples_per_s(self) -> float | None:
        """All samples over all seconds; None for a window without time."""
        return self.samples / self.seconds if self.seconds > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        if self.tokens is None or self.seconds <= 0:
            return None
        return self.tokens / self.seconds

    @property
    def data_share(self) -> float | None:
        """The share of the window's time spent waiting for data (all waits over all
        seconds); None for a window without time."""
        return self.data_seconds / self.seconds if self.seconds > 0 else None

    @property
    def step_seconds(self) -> float | None:
        """The mean step: all seconds over the steps (None without steps)."""
        return self.seconds / self.steps if self.steps else None


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _number(record: Any, name: str, i: int) -> float | None:
    value = _field(record, name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"records[{i}].{name}={shown(value)}: must be a finite number or None")
    if value < 0:
        raise ValueError(f"records[{i}].{name}={shown(value)}: must be >= 0")
    return float(value)


def throughput(records: Iterable[Any]) -> Throughput:
    """The samples, tokens, seconds and data wait of `records` in all (see the module
    docstring); a record without `step_seconds` is left out. ValueError naming the record
    and field that is not a finite number >= 0."""
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise ValueError(
            f"records={shown(records)}: must be a sequence of StepRecords or dicts of their fields"
        )
    steps, samples, seconds, data = 0, 0.0, 0.0, 0.0
    tokens: float | None = 0.0
    for i, r in enumerate(records):
        if r is None or isinstance(r, (str, bytes)):
            raise ValueError(
                f"records[{i}]={shown(r)}: must be a StepRecord or a dict of its fields"
            )
        step_s = _number(r, "step_seconds", i)
        if step_s is None:
            continue
        rate = _number(r, "samples_per_s", i)
        token_rate = _number(r, "tokens_per_s", i)
        steps += 1
        seconds += step_s
        data += _number(r, "data_seconds", i) or 0.0
        samples += (rate or 0.0) * step_s
        tokens = None if tokens is None or token_rate is None else tokens + token_rate * step_s
    return Throughput(steps, samples, tokens if steps else None, seconds, data)


#: the most steps a live rate (a panel's status line) is read over
RECENT_STEPS = 20


def recent(records: Sequence[Any]) -> list[Any]:
    """The steps a live rate is read over: the last `RECENT_STEPS` of `records` (in step
    order), or those since the last settings change when fewer (the record whose `changes`
    is not empty ran with the new settings and starts them), leaving out warm-up steps (a
    new engine's first step: `warmup`) unless nothing else is left. `throughput(recent(r))`
    is the rate to show."""
    window = list(records[-RECENT_STEPS:])
    for i in range(len(window) - 1, -1, -1):
        if _field(window[i], "changes"):
            window = window[i:]
            break
    settled = [r for r in window if not _field(r, "warmup")]
    return settled or window


__all__ = ["RECENT_STEPS", "Throughput", "recent", "throughput"]
