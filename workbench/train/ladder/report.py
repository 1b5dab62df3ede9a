"""The optimization ladder's results: what each rung measured, whether it helped, as a
table, a plain dict / JSON and a bar chart.

Pure Python (matplotlib only when a chart is drawn): `workbench.train.ladder.run` runs
the rungs and hands this module one `RunMeasure` per rung and repeat; `summarize` turns
them into a `LadderResult`.

How the figures are made, so that noise does not invent a speed-up:

* throughput: a rung's samples/s is a ratio of sums, all the samples of its steady steps
  over all their seconds, every repeat together (a steady step is one after the first of a
  run: the first carries one-off costs, start-up, loader workers, compilation). Never the
  median of each step's rate: with loader workers the batches arrive in bursts, the steps
  alternate between a long wait and almost none, and the median step is one of the fast
  ones, a rate the run never sustains (`workbench.rates`).
* its spread: each run's steady steps are cut into consecutive windows (`windows`: four,
  fewer when a run has under 8 steady steps so that each keeps at least 2; one a step when
  it has under 4), each window's rate again its samples over its seconds; the spread is
  the 25th to 75th percentile of the window rates (`workbench.spread.spread`), widened to
  include the rung's own rate where the percentiles leave it out. Windows of a few steps
  take in a burst and the waits around it, so the spread shows how the sustained rate
  varies (other work, a slow stretch), not the bursts themselves.
* a ratio of two rungs (the speed-up over the baseline, the gain over the previous rung)
  is the ratio of their rates; its spread is the lowest and highest ratio the two
  spreads allow (low over high, high over low). A rung **helped** when the whole spread
  of its gain over the previous rung lies above 1, is **slower** when it lies below 1,
  and otherwise made **no clear change**; "slower" and "no clear change" are reported as
  "did not help".
* with a `target_loss`, the gain is measured on the time to reach it instead (samples to
  target / the rung's samples per second), which is the honest measure for a schedule or
  a larger batch: they buy fewer samples to a loss, not faster steps. A rung that reaches
  the target when the previous one does not helped, and the reverse did not help.
* `time_seconds` (the rung's samples) and `time_to_target_seconds` (its samples to the
  target) are samples over the rung's samples/s; `step_seconds` is its median steady step,
  a typical step time, which a burst of fast steps can put below the mean step.
* one-off costs are reported apart from the step time: `warmup_seconds` is the first
  step's time minus the median step (under `compile` that is the compile time),
  `startup_seconds` the wall time of a run outside its steps (building the session, or
  launching the ranks and their process group).
* the rung that turns `compile` on says beside its speed what compile saved against the
  rung before it (`compile_memory_line`): measured (the memory figure of both rungs'
  first repeats) and predicted (the estimator's term "recomputed under torch.compile",
  `workbench.estimate.compiled`, which the prediction of a compiled rung subtracts).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from workbench.display import Display, Readable, fmt_bytes, fmt_number, fmt_seconds
from workbench.inputs import shown
from workbench.spread import figure_png, spread, spread_bars

# bar colours: helped, slower, no clear change, the baseline, failed
_HELPED, _SLOWER, _SAME, _BASE, _FAILED = "#2e7d32", "#c62828", "#9e9e9e", "#1565c0", "#424242"
_COLOURS = {
    "helped": _HELPED,
    "slower": _SLOWER,
    "no gain": _SAME,
    "baseline": _BASE,
    "failed": _FAILED,
}


@dataclass(frozen=True)
class RunMeasure:
    """One run of one rung (one repeat): what its steps measured.

    `step_seconds`: every step's time in order (the first is the warm-up step);
    `losses`: every step's mean training loss over all ranks; `wall_seconds`: the run
    from building its session (or launching its ranks) to its last step. Memory (first
    repeat only, else None): `memory_measured_bytes` and `memory_predicted_bytes` with
    `memory_note` saying what both count. `error`: why the run failed (then the rest may
    be empty)."""

    step_seconds: tuple[float, ...]
    losses: tuple[float, ...]
    wall_seconds: float
    memory_measured_bytes: int | None = None
    memory_predicted_bytes: int | None = None
    memory_note: str = ""
    notes: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class RungPlan:
    """What a rung runs, as `summarize` needs it: its name, its own changes, the settings
    it trains with (TrainConfig as a dict, after LR scaling), ranks, effective batch and
    optimizer steps per run."""

    name: str
    changes: dict[str, Any]
    settings: dict[str, Any]
    ranks: int
    effective_batch: int
    steps: int


@dataclass(frozen=True)
class RungResult:
    """One rung of the ladder, measured (see the module docstring for each figure).

    Ratios are None for a failed rung; `speedup*` compare with the baseline's samples/s,
    `gain*` with the previous rung's measure (time to target when one was given and both
    reached it, else samples/s). `verdict`: "baseline", "helped", "no gain", "slower" or
    "failed"; `helped` is None for the baseline and a failed rung.
    """

    name: str
    changes: dict[str, Any]
    settings: dict[str, Any]
    ranks: int
    effective_batch: int
    steps: int
    samples: int
    runs: int
    samples_per_s: float | None
    samples_per_s_low: float | None
    samples_per_s_high: float | None
    step_seconds: float | None
    time_seconds: float | None  # the rung's samples over its samples/s
    warmup_seconds: float | None
    startup_seconds: float | None
    final_loss: float | None
    steps_to_target: int | None
    samples_to_target: int | None
    time_to_target_seconds: float | None
    memory_measured_bytes: int | None
    memory_predicted_bytes: int | None
    memory_note: str
    speedup: float | None
    speedup_low: float | None
    speedup_high: float | None
    gain: float | None
    gain_low: float | None
    gain_high: float | None
    gain_measure: str | None  # "samples/s" | "time to target" | "target reached" | None
    verdict: str
    helped: bool | None
    summary: str
    notes: tuple[str, ...] = ()
    error: str | None = None
    step_samples_per_s: tuple[float, ...] = ()  # every measured step, all repeats
    losses: tuple[float, ...] = ()  # the first repeat's loss per step

    @property
    def reached_target(self) -> bool:
        return self.steps_to_target is not None


@dataclass(frozen=True)
class LadderResult(Readable):
    """The ladder: one `RungResult` per rung, the baseline first. `setup` says how it
    was measured (model, device, samples per rung, repeats, target loss, LR rule).
    `str(result)` and a notebook show the table; `to_dict()` / `to_json()` the numbers;
    `chart()` / `chart_png()` the speed-up per rung with its spread."""

    rungs: tuple[RungResult, ...]
    setup: dict[str, Any]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def baseline(self) -> RungResult:
        return self.rungs[0]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rungs)

    def rung(self, name: str) -> RungResult:
        for r in self.rungs:
            if r.name == name:
                return r
        raise ValueError(f"name={shown(name)}: not a rung of this ladder ({', '.join(self.names)})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "setup": dict(self.setup),
            "notes": list(self.notes),
            "rungs": [asdict(r) for r in self.rungs],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """`to_dict()` as strict JSON: a loss that diverged (NaN, inf) is null, never the
        `NaN` that strict JSON readers refuse."""
        return json.dumps(_finite(self.to_dict()), indent=indent, default=str, allow_nan=False)

    # ------------------------------------------------------------------ the table
    def _display(self) -> Display:
        target = self.setup.get("target_loss")
        previous = "vs previous" + (" (to target)" if target is not None else "")
        header = ["rung", "samples/s", "speed-up", previous, "time", "steps"]
        if target is not None:
            header.append(f"to loss {fmt_number(target)}")
        header += ["memory measured", "predicted", "final loss", "helped"]
        rows = []
        for r in self.rungs:
            if r.error is not None:
                rows.append([r.name, "failed", *[""] * (len(header) - 3), "n/a"])
                continue
            cells = [
                r.name,
                f"{fmt_number(r.samples_per_s, 3)} [{fmt_number(r.samples_per_s_low, 3)}-"
                f"{fmt_number(r.samples_per_s_high, 3)}]",
                _ratio_cell(r.speedup, r.speedup_low, r.speedup_high),
                ""
                if r.verdict == "baseline"
                else ("reaches it" if r.helped else "misses it")
                if r.gain_measure == "target reached"
                else _ratio_cell(r.gain, r.gain_low, r.gain_high),
                fmt_seconds(r.time_seconds),
                f"{r.steps} x {r.effective_batch}",
            ]
            if target is not None:
                cells.append(
                    f"{fmt_seconds(r.time_to_target_seconds)} ({_steps(r.steps_to_target)})"
                    if r.reached_target
                    else "not reached"
                )
            cells += [
                fmt_bytes(r.memory_measured_bytes),
                fmt_bytes(r.memory_predicted_bytes),
                fmt_number(r.final_loss),
                {"baseline": "", "helped": "yes"}.get(r.verdict, "no"),
            ]
            rows.append(cells)
        notes = [f"{r.name}: {r.summary}" for r in self.rungs[1:]]
        if self.setup.get("kind") == "memory":
            notes += memory_notes(self.rungs)
        for r in self.rungs:
            notes += [f"{r.name}: {n}" for n in r.notes]
        notes += list(self.notes)
        s = self.setup
        title = (
            f"{'memory' if s.get('kind') == 'memory' else 'optimization'} ladder: "
            f"{s.get('model')} on {s.get('device')}, {s.get('samples')} "
            f"samples per rung, {s.get('repeats')} repeat(s)"
        )
        return Display(title, rows, header=header, notes=notes)

    # ------------------------------------------------------------------ the chart
    def chart(self) -> Any:
        """A matplotlib `Figure` (no pyplot): the speed-up over the baseline per rung with
        its spread as whiskers, coloured by whether the rung helped over the previous one
        (green), was slower (red) or made no clear change (grey); with a target loss, the
        time to reach it beside it."""
        from matplotlib.figure import Figure

        target = self.setup.get("target_loss")
        panels = 2 if target is not None else 1
        n = len(self.rungs)
        fig = Figure(figsize=(4.6 * panels + 1.6, 1.1 + 0.5 * n), dpi=80)
        axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
        y = list(range(n))
        colours = [_COLOURS.get(r.verdict, _SAME) for r in self.rungs]
        labels = [
            r.name + ("\n(failed)" if r.error else "\n(did not help)" if r.helped is False else "")
            for r in self.rungs
        ]
        ax = axes[0]
        values = [r.speedup or 0.0 for r in self.rungs]
        spread_bars(
            ax,
            values,
            colours=colours,
            texts=[
                "failed" if r.error else f"{v:.2f}x"
                for v, r in zip(values, self.rungs, strict=True)
            ],
            ranges=[
                (r.speedup_low or v, r.speedup_high or v)
                for v, r in zip(values, self.rungs, strict=True)
            ],
        )
        ax.axvline(1.0, color="#616161", lw=0.8, ls="--")
        ax.set_title("speed-up over the baseline (samples/s)", fontsize=9)
        ax.margins(x=0.2)
        if target is not None:
            ax2 = axes[1]
            times = [r.time_to_target_seconds or 0.0 for r in self.rungs]
            spread_bars(
                ax2,
                times,
                colours=colours,
                texts=[
                    fmt_seconds(t) if r.reached_target else "not reached"
                    for t, r in zip(times, self.rungs, strict=True)
                ],
            )
            if not any(times):
                ax2.set_xlim(0, 1)
                ax2.set_xticks([])
            ax2.set_title(
                f"time to loss {fmt_number(target)} (s, at the rung's samples/s)", fontsize=9
            )
            ax2.margins(x=0.3)
        for a in axes:
            a.tick_params(labelsize=8)
        axes[0].set_yticks(y)
        axes[0].set_yticklabels(labels, fontsize=8)
        axes[0].invert_yaxis()
        s = self.setup
        fig.suptitle(
            f"optimization ladder: {s.get('model')} on {s.get('device')}, "
            f"{s.get('repeats')} repeat(s)",
            fontsize=10,
        )
        fig.text(
            0.5,
            0.0,
            "bars: all samples over all seconds; whiskers: the lowest-highest ratio the "
            "25th-75th percentiles of windows of steps allow; "
            "green: helped over the previous rung, red: slower, grey: no clear change",
            ha="center",
            va="top",
            fontsize=7,
            color="#616161",
        )
        fig.tight_layout()
        return fig

    def chart_png(self, dpi: int = 80) -> bytes:
        """`chart()` as PNG bytes."""
        return figure_png(self.chart(), dpi)


def memory_notes(rungs: Sequence[RungResult]) -> list[str]:
    """The memory ladder's verdict per rung: what it frees (measured, and predicted)
    and what it costs in step time (the mean step: effective batch over samples/s), each
    against the last rung that ran."""
    out: list[str] = []
    prev: RungResult | None = None
    for r in rungs:
        if r.error is not None:
            continue
        if prev is not None and r.memory_measured_bytes and prev.memory_measured_bytes:
            freed = prev.memory_measured_bytes - r.memory_measured_bytes
            predicted = (
                prev.memory_predicted_bytes - r.memory_predicted_bytes
                if r.memory_predicted_bytes and prev.memory_predicted_bytes
                else None
            )
            cost = (
                "step time x"
                + fmt_number(
                    (r.effective_batch / r.samples_per_s)
                    / (prev.effective_batch / prev.samples_per_s),
                    3,
                )
                if r.samples_per_s and prev.samples_per_s
                else "step time n/a"
            )
            what = "frees" if freed >= 0 else "adds"
            out.append(
                f"{r.name}: memory {what} {fmt_bytes(abs(freed))} measured"
                + (f" ({fmt_bytes(predicted)} predicted)" if predicted is not None else "")
                + f" vs {prev.name}; {cost}"
            )
        prev = r
    return out


def _memory_of(st: _Stats) -> RunMeasure | None:
    """The run of a rung that measured its memory (the first repeat), if any."""
    return next((r for r in st.runs if r.memory_note), None)


def compile_memory_line(before: RunMeasure | None, after: RunMeasure | None, previous: str) -> str:
    """The compile rung's memory beside its speed: what turning compile on saves against
    the `previous` rung, measured (the activations its compiled forward keeps, counted
    from the tensors, or the CUDA peak) and predicted (the estimator's term "recomputed
    under torch.compile", `workbench.estimate.compiled`)."""
    if before is None or after is None:
        return "; memory not measured"
    measured = _saving(before.memory_measured_bytes, after.memory_measured_bytes)
    predicted = _saving(before.memory_predicted_bytes, after.memory_predicted_bytes)
    return f"; memory vs {previous}: {measured} measured, {predicted} predicted"


def _saving(before: int | None, after: int | None) -> str:
    if before is None or after is None:
        return "n/a"
    saved = before - after
    return f"{'saves' if saved >= 0 else 'adds'} {fmt_bytes(abs(saved))}"


def _steps(n: int | None) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _ratio_cell(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}x [{fmt_number(low, 3)}-{fmt_number(high, 3)}]"


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None (nested too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# --------------------------------------------------------------------------- statistics
class Band(NamedTuple):
    """A figure with its spread: `value` and the `low`-`high` range around it (a rung's
    samples/s, a ratio of two rungs)."""

    value: float
    low: float
    high: float


#: the windows each run's steady steps are cut into for the spread of a rung's rate
WINDOWS = 4


def windows(steps: Sequence[float], most: int = WINDOWS) -> list[list[float]]:
    """`steps` (a run's step times, in order) cut into consecutive windows of as even a
    length as can be: `most` of them when there are 2 x `most` steps or more, else as many
    as keep at least 2 steps each; one a step under 4 steps (two windows of two steps are
    not possible, and one window would show no spread at all)."""
    n = len(steps)
    k = min(most, n // 2) if n >= 4 else n
    out, start = [], 0
    for i in range(k):
        size = n // k + (1 if i < n % k else 0)
        out.append(list(steps[start : start + size]))
        start += size
    return out


def rate_band(runs: Sequence[Sequence[float]], batch: int) -> Band | None:
    """The samples/s of steps of `batch` samples whose times are `runs` (one sequence a
    run): all samples over all seconds, with the 25th-75th percentile of its windows'
    rates (`windows`, each a ratio of sums) as its spread, widened to include the rate
    itself. None without a step of positive time."""
    steps = [s for run in runs for s in run]
    if not steps or sum(steps) <= 0:
        return None
    rate = batch * len(steps) / sum(steps)
    rates = [batch * len(w) / sum(w) for run in runs for w in windows(run) if sum(w) > 0]
    quartiles = spread(rates)
    if quartiles is None:
        return Band(rate, rate, rate)
    return Band(rate, min(quartiles.p25, rate), max(quartiles.p75, rate))


def ratio(a: Band, b: Band) -> Band:
    """a / b for two figures with their spreads: the ratio of the values, and the lowest
    and highest ratio their ranges allow."""
    return Band(a.value / b.value, a.low / b.high, a.high / b.low)


def first_at_or_below(losses: Sequence[float], target: float) -> int | None:
    """The 1-based step whose loss is first at or below `target`, else None."""
    for i, loss in enumerate(losses):
        if math.isfinite(loss) and loss <= target:
            return i + 1
    return None


def _final_loss(losses: Sequence[float]) -> float | None:
    """Mean loss of the last quarter of the steps (at least the last step): the same
    share of the samples for every rung, since every rung trains on the same samples."""
    finite = [x for x in losses if math.isfinite(x)]
    if not finite:
        return None
    k = max(1, len(losses) // 4)
    tail = [x for x in losses[-k:] if math.isfinite(x)]
    return statistics.fmean(tail) if tail else None


# --------------------------------------------------------------------------- summarize
@dataclass
class _Stats:
    plan: RungPlan
    runs: list[RunMeasure]
    thr: Band | None = None
    steps_per_s: tuple[float, ...] = ()
    step_s: float | None = None
    warmup_s: float | None = None
    startup_s: float | None = None
    final_loss: float | None = None
    steps_to_target: int | None = None
    error: str | None = None


def _stats(plan: RungPlan, runs: list[RunMeasure], target: float | None) -> _Stats:
    st = _Stats(plan, runs)
    failed = [r for r in runs if r.error is not None]
    if failed or not runs:
        st.error = failed[0].error if failed else "no run"
        return st
    per_run = [[s for s in r.step_seconds[1:] if s > 0] for r in runs]
    if not any(per_run):  # one-step runs: their only step is the warm-up step
        per_run = [[s for s in r.step_seconds if s > 0] for r in runs]
    steady = [s for steps in per_run for s in steps]
    st.steps_per_s = tuple(plan.effective_batch / s for s in steady)
    st.thr = rate_band(per_run, plan.effective_batch)
    st.step_s = statistics.median(steady) if steady else None
    if st.step_s is not None:
        extra = [r.step_seconds[0] - st.step_s for r in runs if len(r.step_seconds) > 1]
        st.warmup_s = max(0.0, statistics.median(extra)) if extra else None
        st.startup_s = statistics.median(
            max(0.0, r.wall_seconds - sum(r.step_seconds)) for r in runs
        )
    finals = [f for r in runs if (f := _final_loss(r.losses)) is not None]
    st.final_loss = statistics.fmean(finals) if finals else None
    if target is not None:
        hits = [first_at_or_below(r.losses, target) for r in runs]
        if all(h is not None for h in hits):
            st.steps_to_target = max(h for h in hits if h is not None)
    return st


def _verdict(
    this: _Stats, prev: _Stats, target: float | None
) -> tuple[str, float | None, float | None, float | None, str | None, str]:
    """(verdict, gain, low, high, measure, summary) of `this` rung over `prev`."""
    assert this.thr is not None and prev.thr is not None
    gain, low, high = ratio(this.thr, prev.thr)
    measure = "samples/s"
    if target is not None:
        if this.steps_to_target is not None and prev.steps_to_target is not None:
            # time to target = samples to target / samples per second
            s_prev = prev.steps_to_target * prev.plan.effective_batch
            s_this = this.steps_to_target * this.plan.effective_batch
            gain, low, high = (x * s_prev / s_this for x in (gain, low, high))
            measure = "time to target"
        elif this.steps_to_target is not None:
            return (
                "helped",
                None,
                None,
                None,
                "target reached",
                f"helped: reaches loss {fmt_number(target)} "
                f"({_steps(this.steps_to_target)}); the previous rung did not",
            )
        elif prev.steps_to_target is not None:
            return (
                "slower",
                None,
                None,
                None,
                "target reached",
                f"did not help: does not reach loss {fmt_number(target)}; the previous rung "
                f"did ({_steps(prev.steps_to_target)})",
            )
    what = "the previous rung's " + (
        "speed to the target loss" if measure != "samples/s" else "samples/s"
    )
    band = f"spread {low:.2f}-{high:.2f}x"
    if low > 1:
        return "helped", gain, low, high, measure, f"helped: {gain:.2f}x {what} ({band})"
    if high < 1:
        return (
            "slower",
            gain,
            low,
            high,
            measure,
            f"did not help: slower, {gain:.2f}x {what} ({band})",
        )
    return (
        "no gain",
        gain,
        low,
        high,
        measure,
        f"did not help: no clear change, {gain:.2f}x {what} ({band}, which includes 1)",
    )


def summarize(
    plans: Sequence[RungPlan],
    runs: Sequence[Sequence[RunMeasure]],
    *,
    setup: dict[str, Any],
    target_loss: float | None = None,
    notes: Sequence[str] = (),
) -> LadderResult:
    """The ladder's result from each rung's plan and its runs (one per repeat)."""
    if len(plans) != len(runs) or not plans:
        raise ValueError("plans and runs: one list of runs per rung, at least the baseline")
    stats = [_stats(p, list(r), target_loss) for p, r in zip(plans, runs, strict=True)]
    base = stats[0]
    results = []
    prev: _Stats | None = None
    for i, st in enumerate(stats):
        p = st.plan
        first = st.runs[0] if st.runs else None
        mem = [r for r in st.runs if r.memory_note]
        memory = mem[0] if mem else None
        rung_notes = tuple(dict.fromkeys(n for r in st.runs for n in r.notes))
        common: dict[str, Any] = {
            "name": p.name,
            "changes": dict(p.changes),
            "settings": dict(p.settings),
            "ranks": p.ranks,
            "effective_batch": p.effective_batch,
            "steps": p.steps,
            "samples": p.steps * p.effective_batch,
            "runs": len(st.runs),
            "memory_measured_bytes": memory.memory_measured_bytes if memory else None,
            "memory_predicted_bytes": memory.memory_predicted_bytes if memory else None,
            "memory_note": memory.memory_note if memory else "",
            "notes": rung_notes,
        }
        if st.error is not None or st.thr is None:
            results.append(
                RungResult(
                    **common,
                    samples_per_s=None,
                    samples_per_s_low=None,
                    samples_per_s_high=None,
                    step_seconds=None,
                    time_seconds=None,
                    warmup_seconds=None,
                    startup_seconds=None,
                    final_loss=None,
                    steps_to_target=None,
                    samples_to_target=None,
                    time_to_target_seconds=None,
                    speedup=None,
                    speedup_low=None,
                    speedup_high=None,
                    gain=None,
                    gain_low=None,
                    gain_high=None,
                    gain_measure=None,
                    verdict="failed",
                    helped=None,
                    summary=f"failed: {st.error}",
                    error=st.error,
                )
            )
            continue
        speed = ratio(st.thr, base.thr) if base.thr is not None else None
        if i == 0:
            verdict, gain, low, high, measure, summary = (
                "baseline",
                None,
                None,
                None,
                None,
                "the baseline",
            )
        elif prev is None:
            verdict, gain, low, high, measure = "no gain", None, None, None, None
            summary = "no earlier rung ran to compare with"
        else:
            verdict, gain, low, high, measure, summary = _verdict(st, prev, target_loss)
        if st.warmup_s is not None and p.settings.get("compile"):
            summary += f"; compile time {fmt_seconds(st.warmup_s)} (the first step, once)"
        if p.changes.get("compile") and prev is not None:
            summary += compile_memory_line(_memory_of(prev), memory, prev.plan.name)
        hit = st.steps_to_target
        results.append(
            RungResult(
                **common,
                samples_per_s=st.thr.value,
                samples_per_s_low=st.thr.low,
                samples_per_s_high=st.thr.high,
                step_seconds=st.step_s,
                time_seconds=p.steps * p.effective_batch / st.thr.value,
                warmup_seconds=st.warmup_s,
                startup_seconds=st.startup_s,
                final_loss=st.final_loss,
                steps_to_target=hit,
                samples_to_target=None if hit is None else hit * p.effective_batch,
                time_to_target_seconds=None
                if hit is None
                else hit * p.effective_batch / st.thr.value,
                speedup=None if speed is None else speed.value,
                speedup_low=None if speed is None else speed.low,
                speedup_high=None if speed is None else speed.high,
                gain=gain,
                gain_low=low,
                gain_high=high,
                gain_measure=measure,
                verdict=verdict,
                helped=None if i == 0 else verdict == "helped",
                summary=summary,
                step_samples_per_s=st.steps_per_s,
                losses=tuple(first.losses) if first is not None else (),
            )
        )
        prev = st
    return LadderResult(tuple(results), dict(setup), tuple(notes))
