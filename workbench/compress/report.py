"""The before/after report: size, speed and quality of each compressed model, measured.

`CompressionReport` holds one `Row` per model: the model before compression first, then
each method. `str(report)` and a notebook show it as a table; `report.verdict(method)`
says in words what the method buys on this hardware, and says so plainly when it buys
nothing (a change within `NOISE` of the model before counts as no change) or when it
costs more quality than the report's `QualityTolerance` allows (then it does not pay
until retrained); `report.chart()` draws the same as bars; `report.to_dict()` gives the
raw numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.display import Display, Readable, fmt_bytes, fmt_number, fmt_seconds
from workbench.inputs import shown
from workbench.problems import ConfigError, SettingProblem
from workbench.spread import figure_png, spread_bars

#: Ratios within 10% of 1 count as "no change": on a shared machine timings of the same
#: work vary by about that much from one turn to the next.
NOISE = 0.10
#: In the chart, a held-out loss or accuracy within 1% of the model before's is drawn as
#: unchanged (the table and verdicts give the exact figures).
QUALITY_NOISE = 0.01
#: The quality a method may lose and still pay (`QualityTolerance`'s defaults): its
#: held-out loss at most 1.05x the model before's, its accuracy at most 1 point lower.
#: A choice, not a law: a served model's quality budget is its owner's to set
#: (`compress(..., max_loss_ratio=..., max_accuracy_drop=...)`).
MAX_LOSS_RATIO = 1.05
MAX_ACCURACY_DROP = 1.0
#: What a report's quality figures were measured on: data the model never trained on, or
#: data it may have trained on (a checkpoint's own data set, a session's data).
QUALITY_DATA = ("held-out", "eval")
#: What recovers the quality a smaller model lost, said in a verdict that lost some.
RETRAIN = (
    "training the smaller model further can recover it (fine-tune it on the training data, "
    "or distill the model before into it), then measure again"
)

# bar colours: better, worse, no change, the model before
_BETTER, _WORSE, _SAME, _BEFORE = "#2e7d32", "#c62828", "#9e9e9e", "#1565c0"


@dataclass(frozen=True)
class Figures:
    """What one model measured. Latency: seconds per forward pass of one batch, the median
    of `latency_samples` timed repeats, with the 25th and 75th percentiles and the fastest
    repeat (other work on the machine can slow a call down, never speed it up)."""

    params_bytes: int
    disk_bytes: int
    latency_seconds: float
    latency_p25_seconds: float
    latency_p75_seconds: float
    latency_min_seconds: float
    latency_samples: int
    loss: float
    accuracy: float | None
    zero_fraction: float | None
    held_out_samples: int


@dataclass(frozen=True)
class Row:
    """One model of the report: `method` ("before" for the model before compression), its
    figures, the layers the method changed or skipped, and notes on how it was done."""

    method: str
    figures: Figures
    layers: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    why_no_gain: str = ""


def tolerance_problems(max_loss_ratio: Any, max_accuracy_drop: Any) -> list[SettingProblem]:
    """What is wrong with a quality tolerance (empty when both values are usable)."""
    problems = []
    if not _finite(max_loss_ratio) or max_loss_ratio < 1:
        problems.append(
            SettingProblem(
                "max_loss_ratio",
                max_loss_ratio,
                "must be a finite number >= 1 (the held-out loss after compression over the "
                "loss before that still pays; 1 allows no rise)",
            )
        )
    if not _finite(max_accuracy_drop) or not 0 <= max_accuracy_drop <= 100:
        problems.append(
            SettingProblem(
                "max_accuracy_drop",
                max_accuracy_drop,
                "must be a number of accuracy points in [0, 100] (0 allows no drop)",
            )
        )
    return problems


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class QualityTolerance:
    """How much held-out quality a method may lose and still pay: its held-out loss at most
    `max_loss_ratio` times the model before's, its accuracy (where the task has one) at
    most `max_accuracy_drop` percentage points lower. Bad values raise a ValueError naming
    each field, the value and what is allowed."""

    max_loss_ratio: float = MAX_LOSS_RATIO
    max_accuracy_drop: float = MAX_ACCURACY_DROP

    def __post_init__(self) -> None:
        problems = tolerance_problems(self.max_loss_ratio, self.max_accuracy_drop)
        if problems:
            raise ConfigError(problems)

    def __str__(self) -> str:
        return (
            f"loss at most {self.max_loss_ratio:g}x the model before's, accuracy at most "
            f"{self.max_accuracy_drop:g} point{'' if self.max_accuracy_drop == 1 else 's'} lower"
        )


@dataclass(frozen=True)
class Verdict:
    """What a method buys, relative to the model before (ratios are after / before), and
    what it costs in held-out quality against the report's `QualityTolerance`."""

    method: str
    size_ratio: float
    latency_ratio: float  # of the medians
    fastest_ratio: float  # of the fastest repeats
    loss_change: float
    accuracy_change: float | None
    size: str  # "smaller" | "larger" | "same"
    latency: str  # "faster" | "slower" | "same" | "unclear" (median and fastest disagree)
    pays: bool  # smaller or faster beyond the noise, and quality within the tolerance
    summary: str
    # the held-out loss after / before (None when the loss before is not a positive number)
    loss_ratio: float | None = None
    # "kept" (within the tolerance) | "lost" (beyond it) | "not judged" (no finite loss before)
    quality: str = "kept"
    lost: str = ""  # what was lost beyond the tolerance, in words ("" when kept)

    @property
    def outcome(self) -> str:
        """The verdict in a few words: "pays", "smaller, but slower here", "smaller and
        faster, but loses quality" (or "smaller, ..." / "faster, ..."), "does not pay here"."""
        gains = [
            word
            for word, gained in (
                ("smaller", self.size == "smaller"),
                ("faster", self.latency == "faster"),
            )
            if gained
        ]
        if self.pays:
            return "smaller, but slower here" if self.latency == "slower" else "pays"
        if gains and self.quality == "lost":
            return f"{' and '.join(gains)}, but loses quality"
        return "does not pay here"


def _chart_label(v: Verdict) -> str:
    """A method's label in the chart: its name, marked when it does not pay."""
    if v.pays:
        return v.method
    if v.quality == "lost" and v.outcome != "does not pay here":
        return f"{v.method}\n(loses quality)"
    return f"{v.method}\n(does not pay here)"


def _direction(ratio: float, better: str, worse: str) -> str:
    if ratio < 1 - NOISE:
        return better
    if ratio > 1 + NOISE:
        return worse
    return "same"


def _times(ratio: float, better: str, worse: str) -> str:
    if ratio < 1 - NOISE:
        return f"{1 / ratio:.2g}x {better}"
    if ratio > 1 + NOISE:
        return f"{ratio:.2g}x {worse}"
    return f"no {'size' if better == 'smaller' else 'speed'} change (within {NOISE:.0%})"


def _ratio(after: float, before: float) -> float:
    return after / before if before > 0 else 1.0


def _above(ratio: float, limit: float) -> str:
    """`ratio` to 3 significant digits, or as many more as show it above `limit` (1.053
    beside a limit of 1.05 is "1.053", not "1.05")."""
    for digits in range(3, 10):
        text = f"{ratio:.{digits}g}"
        if float(text) > limit:
            return text
    return repr(ratio)


def _quality(
    b: Figures, a: Figures, acc: float | None, tolerance: QualityTolerance, data: str
) -> tuple[float | None, str, list[str]]:
    """(loss ratio, "kept" | "lost" | "not judged", what was lost beyond `tolerance`)."""
    loss_ratio = a.loss / b.loss if math.isfinite(b.loss) and b.loss > 0 else None
    if not math.isfinite(b.loss):
        return loss_ratio, "not judged", []
    lost = []
    # the loss may rise by (ratio - 1) of its size: after/before <= ratio for a positive loss
    allowed = b.loss + (tolerance.max_loss_ratio - 1) * abs(b.loss)
    if not math.isfinite(a.loss) or a.loss > allowed + 1e-12 * abs(b.loss):
        if not math.isfinite(a.loss):
            rise = fmt_number(a.loss)
        elif loss_ratio is not None:
            rise = f"{_above(loss_ratio, tolerance.max_loss_ratio)}x the model before's"
        else:
            rise = f"up from {fmt_number(b.loss)}"
        lost.append(f"{data} loss {rise} (allowed: {tolerance.max_loss_ratio:g}x)")
    if acc is not None and -acc * 100 > tolerance.max_accuracy_drop + 1e-9:
        lost.append(
            f"accuracy {-acc * 100:.1f} points lower (allowed: {tolerance.max_accuracy_drop:g})"
        )
    return loss_ratio, "lost" if lost else "kept", lost


def verdict_of(
    before: Row, after: Row, tolerance: QualityTolerance | None = None, *, data: str = "held-out"
) -> Verdict:
    """Compare `after` with `before` (see `NOISE`). A speed change counts when the medians
    and the fastest repeats agree on it; when they disagree (a busy machine) it is
    "unclear" and counts as none. A method pays when it is smaller or faster and its
    held-out quality stays within `tolerance` (default `QualityTolerance()`); one that is
    smaller or faster but lost more says what it lost and that retraining recovers it.
    `data` names the data the quality was measured on ("held-out", or "eval" when the model
    may have trained on it)."""
    tolerance = QualityTolerance() if tolerance is None else tolerance
    b, a = before.figures, after.figures
    size_ratio = _ratio(a.params_bytes, b.params_bytes)
    latency_ratio = _ratio(a.latency_seconds, b.latency_seconds)
    fastest_ratio = _ratio(a.latency_min_seconds, b.latency_min_seconds)
    size = _direction(size_ratio, "smaller", "larger")
    latency = _direction(latency_ratio, "faster", "slower")
    if _direction(fastest_ratio, "faster", "slower") != latency:
        latency = "unclear"
    acc = a.accuracy - b.accuracy if a.accuracy is not None and b.accuracy is not None else None
    loss_change = a.loss - b.loss
    quality = f"{data} loss {fmt_number(b.loss)} -> {fmt_number(a.loss)}"
    if acc is not None:
        quality += f", accuracy {round(acc * 100, 1) + 0.0:+.1f} points"  # no "-0.0"
    loss_ratio, kept, lost = _quality(b, a, acc, tolerance, data)
    gain = size == "smaller" or latency == "faster"
    pays = gain and kept != "lost"
    speed = (
        f"no clear speed change (median {latency_ratio:.2f}x, fastest repeat "
        f"{fastest_ratio:.2f}x the time before: a busy machine?)"
        if latency == "unclear"
        else _times(latency_ratio, "faster", "slower")
    )
    parts = [_times(size_ratio, "smaller", "larger"), speed, quality]
    if lost:
        parts.append("beyond the tolerance: " + ", ".join(lost))
    elif kept == "not judged":
        parts.append(f"quality not judged (the {data} loss before is not finite)")
    summary = "; ".join(parts)
    if gain and latency == "slower":
        summary += "; slower on this hardware"
    if (not gain or latency == "slower") and after.why_no_gain:
        summary += f" ({after.why_no_gain})"
    if not gain:
        summary = "does not pay on this hardware: " + summary
    elif not pays:
        summary = f"does not pay as it is (it loses quality): {summary}; {RETRAIN}"
    return Verdict(
        method=after.method,
        size_ratio=size_ratio,
        latency_ratio=latency_ratio,
        fastest_ratio=fastest_ratio,
        loss_change=loss_change,
        accuracy_change=acc,
        size=size,
        latency=latency,
        pays=pays,
        summary=summary,
        loss_ratio=loss_ratio,
        quality=kept,
        lost=", ".join(lost),
    )


@dataclass(frozen=True)
class CompressionReport(Readable):
    """Before/after figures of one model and its compressed versions (module docstring).

    `rows[0]` is the model before compression. `models`: the compressed models by method
    (not the one before), to keep, save or measure further. `setup`: how it was measured
    (batch size, repeats, device, threads, held-out samples). `tolerance`: the held-out
    quality a method may lose and still pay (`QualityTolerance`). `quality_data`: what the
    quality figures were measured on, "held-out" (data the model never trained on) or
    "eval" (data it may have trained on: the columns and verdicts say "eval loss").
    """

    title: str
    rows: tuple[Row, ...]
    setup: dict[str, Any]
    models: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    tolerance: QualityTolerance = field(default_factory=QualityTolerance)
    quality_data: str = "held-out"

    def __post_init__(self) -> None:
        if self.quality_data not in QUALITY_DATA:
            raise ValueError(
                f"quality_data={shown(self.quality_data)}: must be one of "
                f"{', '.join(map(repr, QUALITY_DATA))}"
            )

    @property
    def before(self) -> Row:
        return self.rows[0]

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(r.method for r in self.rows[1:])

    def row(self, method: str) -> Row:
        for r in self.rows:
            if r.method == method:
                return r
        raise ValueError(f"method={shown(method)}: not in this report ({', '.join(self.methods)})")

    def verdict(self, method: str) -> Verdict:
        return verdict_of(self.before, self.row(method), self.tolerance, data=self.quality_data)

    def verdicts(self) -> list[Verdict]:
        return [self.verdict(m) for m in self.methods]

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "setup": dict(self.setup),
            "noise": NOISE,
            "tolerance": asdict(self.tolerance),
            "quality_data": self.quality_data,
            "rows": [asdict(r) for r in self.rows],
            "verdicts": [asdict(v) for v in self.verdicts()],
        }

    # ------------------------------------------------------------------ the table
    def _display(self) -> Display:
        has_accuracy = any(r.figures.accuracy is not None for r in self.rows)
        header = [
            "method",
            "weights",
            "on disk",
            "latency/batch",
            "fastest",
            "vs before",
            f"{self.quality_data} loss",
        ]
        if has_accuracy:
            header.append("accuracy")
        header.append("zeros")
        rows = []
        for r in self.rows:
            f = r.figures
            ratio = f.latency_seconds / self.before.figures.latency_seconds
            cells = [
                r.method,
                fmt_bytes(f.params_bytes),
                fmt_bytes(f.disk_bytes),
                fmt_seconds(f.latency_seconds),
                fmt_seconds(f.latency_min_seconds),
                "" if r is self.before else f"{ratio:.2f}x",
                fmt_number(f.loss),
            ]
            if has_accuracy:
                cells.append("n/a" if f.accuracy is None else f"{f.accuracy:.1%}")
            cells.append("n/a" if f.zero_fraction is None else f"{f.zero_fraction:.0%}")
            rows.append(cells)
        s = self.setup
        notes = [f"{v.method}: {v.summary}" for v in self.verdicts()]
        notes.append(
            f"latency: median of {s.get('repeats')} forward passes of the same "
            f"{s.get('batch_size')}-sample batch on {s.get('device')} (torch threads: "
            f"{s.get('threads')}), models taking turns (a speed change counts when the median and the fastest repeat agree); {self.quality_data} quality on {s.get('held_out_samples')} "
            f"samples; changes within {NOISE:.0%} count as none"
        )
        notes.append(
            f"a method pays when it is smaller or faster and keeps its {self.quality_data} "
            f"quality: {self.tolerance}"
        )
        return Display(self.title, rows, header=header, notes=notes)

    # ------------------------------------------------------------------ the chart
    def chart(self) -> Any:
        """A matplotlib `Figure` (no pyplot): weights, latency and held-out quality per
        model, bars coloured by whether each beats the model before (green), loses to it
        (red) or is within the noise (grey); methods that do not pay are marked so."""
        from matplotlib.figure import Figure

        has_accuracy = self.before.figures.accuracy is not None
        panels: list[tuple[str, Callable[[Figures], float], bool]] = [
            ("weights (MiB)", lambda f: f.params_bytes / 2**20, True),
            ("latency per batch (ms)", lambda f: f.latency_seconds * 1e3, True),
            (f"{self.quality_data} loss", lambda f: f.loss, True),
        ]
        if has_accuracy:
            panels.append(
                (f"{self.quality_data} accuracy (%)", lambda f: (f.accuracy or 0.0) * 100, False)
            )
        n = len(self.rows)
        fig = Figure(figsize=(3.0 * len(panels), 0.9 + 0.42 * n), dpi=80)
        axes = fig.subplots(1, len(panels), sharey=True)
        labels = [r.method for r in self.rows]
        y = list(range(n))
        verdicts = {v.method: v for v in self.verdicts()}
        for ax, (title, value, lower_is_better) in zip(axes, panels, strict=True):
            values = [value(r.figures) for r in self.rows]
            base = values[0]
            colours = [_BEFORE]
            for v in values[1:]:
                ratio = v / base if base else 1.0
                if title.startswith(self.quality_data):
                    better = v < base if lower_is_better else v > base
                    same = abs(ratio - 1) <= QUALITY_NOISE
                    colours.append(_SAME if same else (_BETTER if better else _WORSE))
                elif title.startswith("latency"):
                    d = verdicts[labels[len(colours)]].latency
                    colours.append({"faster": _BETTER, "slower": _WORSE}.get(d, _SAME))
                else:
                    d = _direction(ratio, "better", "worse")
                    colours.append({"better": _BETTER, "worse": _WORSE, "same": _SAME}[d])
            latency = title.startswith("latency")
            spread_bars(
                ax,
                values,
                colours=colours,
                texts=[fmt_number(v, 3) for v in values],
                ranges=[
                    (r.figures.latency_p25_seconds * 1e3, r.figures.latency_p75_seconds * 1e3)
                    for r in self.rows
                ]
                if latency
                else None,
                fontsize=7,
            )
            ax.set_title(title, fontsize=9)
            ax.tick_params(labelsize=8)
            ax.margins(x=0.25)
        axes[0].set_yticks(y)
        axes[0].set_yticklabels(
            [label if i == 0 else _chart_label(verdicts[label]) for i, label in enumerate(labels)],
            fontsize=8,
        )
        axes[0].invert_yaxis()
        fig.suptitle(self.title, fontsize=10)
        fig.text(
            0.5,
            0.0,
            f"green: better than before, red: worse, grey: within {NOISE:.0%} (size, latency: "
            f"median and fastest repeat must agree; whiskers: 25th-75th percentile) or "
            f"{QUALITY_NOISE:.0%} (quality)",
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
