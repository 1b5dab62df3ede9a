"""The training panel's figure: loss, samples/s, the step time split into data loading and
compute, and memory measured vs predicted, with a dotted line at each step where a settings
change took effect.

`TrainingCharts` is the drawing half of `workbench.ui.training.TrainingPanel` (which
derives from it): it draws the panel's downsampled `series`, its `change_steps` and its
`memory_report` into one persistent `Chart`, updating the artists in place and moving the
axis limits rarely, so a redraw costs the same at a thousand steps and at a million.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.ui.charts import Chart, Downsampled
from workbench.ui.fields import GIB
from workbench.ui.training_controls import plain


class TrainingCharts:
    """The figure of a training panel, drawn from the panel's state (see the module
    docstring); `_build_chart()` makes the artists, `_draw()` updates them."""

    session: Any
    chart: Chart
    records: list[Any]
    series: dict[str, Downsampled]
    change_steps: list[tuple[int, str]]
    memory_report: Any | None
    _predicted: tuple[Any, Any] | None

    def _build_chart(self) -> None:
        fig = self.chart.figure
        fig.subplots_adjust(left=0.07, right=0.98, top=0.93, bottom=0.09, hspace=0.42, wspace=0.22)
        ax = fig.subplots(2, 2)
        self._ax_loss, self._ax_speed, self._ax_time, self._ax_mem = ax.ravel()
        self._ax_mem.set_title("memory: measured vs predicted (MiB)", fontsize=10)
        (self._line_loss,) = self._ax_loss.plot([], [], color="#1565c0", linewidth=1.2)
        (self._line_speed,) = self._ax_speed.plot([], [], color="#2e7d32", linewidth=1.2)
        (self._line_compute,) = self._ax_time.plot(
            [], [], color="#6a1b9a", linewidth=1.0, label="data + compute"
        )
        (self._line_data,) = self._ax_time.plot(
            [], [], color="#ef6c00", linewidth=1.0, label="data"
        )
        self._fills: list[Any] = []
        self._ax_loss.set_title("loss", fontsize=10)
        self._ax_speed.set_title("samples / s", fontsize=10)
        self._ax_time.set_title("step time: data loading vs compute (s)", fontsize=10)
        self.chart.animate(self._line_loss, self._line_speed, self._line_compute, self._line_data)
        self._ax_time.legend(loc="upper left", fontsize=7)
        for a in (self._ax_loss, self._ax_speed, self._ax_time):
            a.grid(True, alpha=0.3)
            a.set_xlabel("optimizer step", fontsize=8)
        self._change_lines: list[Any] = []
        self._mem_bars: list[Any] = []
        self._mem_labels: tuple[str, ...] = ()
        self._mem_unit = 1 << 20
        self._mem_empty = self._ax_mem.text(
            0.5,
            0.5,
            "no memory figures yet",
            ha="center",
            va="center",
            transform=self._ax_mem.transAxes,
            fontsize=9,
            color="#777",
        )

    def chart_data(self) -> dict[str, list[float]]:
        """What the chart lines now hold (for tests and the benchmark)."""
        return {
            "steps": list(self._line_loss.get_xdata()),
            "loss": list(self._line_loss.get_ydata()),
            "samples_per_s": list(self._line_speed.get_ydata()),
            "data_seconds": list(self._line_data.get_ydata()),
            "step_seconds": list(self._line_compute.get_ydata()),
            "change_steps": [
                float(line.get_xdata()[0])
                for line in self._change_lines
                if line.axes is self._ax_loss
            ],
        }

    def memory_pairs(self) -> list[tuple[str, float | None, float | None]]:
        """(what, measured bytes, predicted bytes) for the memory chart.

        From the last `session.memory()` report when it matches the current settings
        (it includes activations); otherwise measured model states from the newest step
        record next to the estimator's prediction for the current settings.
        """
        report = self.memory_report
        cfg = self.session.config
        rec = self.records[-1] if self.records else None
        if report is not None and report_matches(report, cfg):
            return report_pairs(report) + peak_pair(rec, report.predicted)
        pred = self._prediction(cfg)
        pairs: list[tuple[str, float | None, float | None]] = []
        for label, name in (
            ("parameters", "params_bytes"),
            ("gradients", "grads_bytes"),
            ("optimizer", "optimizer_bytes"),
        ):
            measured = getattr(rec, name, None) if rec is not None else None
            predicted = getattr(pred, name, None) if pred is not None else None
            if measured is not None or predicted is not None:
                pairs.append((label, measured, predicted))
        return pairs + peak_pair(rec, pred)

    def _prediction(self, cfg: Any) -> Any | None:
        """The session's prediction for `cfg` (`Session.predict`, cached per config);
        None when the estimator cannot predict the setup (only measured bars are drawn)."""
        if self._predicted is not None and self._predicted[0] == cfg:
            return self._predicted[1]
        try:
            pred = self.session.predict(cfg)
        except ValueError:
            pred = None
        self._predicted = (cfg, pred)
        return pred

    def _draw(self) -> None:
        # the whole run, downsampled with its extremes: at most 2 points per bucket
        steps, loss = self.series["loss"].points()
        speed_x, speed = self.series["samples_per_s"].points()
        data_x, data = self.series["data_seconds"].points()
        time_x, step_s = self.series["step_seconds"].points()
        self._line_loss.set_data(steps, loss)
        self._line_speed.set_data(speed_x, speed)
        self._line_data.set_data(data_x, data)
        self._line_compute.set_data(time_x, step_s)
        for f in self._fills:
            self.chart.forget(f)
            f.remove()
        self._fills = []
        if time_x:
            # the areas under the upper envelopes (one point per bin): the lines above
            # show every extreme, the areas the share of data loading in a step
            area_x, area_step = self.series["step_seconds"].highs()
            area_data_x, area_data = self.series["data_seconds"].highs()
            self._fills = [
                self._ax_time.fill_between(
                    area_x, 0, area_step, color="#6a1b9a", alpha=0.25, linewidth=0
                ),
                self._ax_time.fill_between(
                    area_data_x, 0, area_data, color="#ef6c00", alpha=0.35, linewidth=0
                ),
            ]
            self.chart.animate(*self._fills)
        changed = False
        for ax, xs, ys, zero in (
            (self._ax_loss, steps, loss, False),
            (self._ax_speed, speed_x, speed, True),
            (self._ax_time, time_x, step_s, True),
        ):
            changed |= sticky_limits(ax, xs, ys, from_zero=zero)
        # a vertical line at each step where settings changed
        drawn = {(float(line.get_xdata()[0]), line.axes) for line in self._change_lines}
        for step, text in self.change_steps:
            for a in (self._ax_loss, self._ax_speed, self._ax_time):
                if (float(step), a) not in drawn:
                    line = a.axvline(step, color="#c62828", linestyle=":", linewidth=1.2)
                    line.set_gid(text)
                    self._change_lines.append(line)
                    self.chart.animate(line)
                    if a is self._ax_loss:
                        note = a.annotate(
                            text,
                            (step, 1.0),
                            xycoords=("data", "axes fraction"),
                            fontsize=7,
                            color="#c62828",
                            rotation=90,
                            va="top",
                            ha="right",
                        )
                        self.chart.animate(note)
        changed |= self._draw_memory()
        if changed:
            self.chart.invalidate()
        self.chart.render()

    def _draw_memory(self) -> bool:
        """Update the memory bars; True when the background (labels, limits) changed."""
        try:
            pairs = self.memory_pairs()
        except Exception:
            pairs = []
        pairs = [p for p in pairs if p[1] is not None or p[2] is not None]
        labels = tuple(p[0] for p in pairs)
        ax = self._ax_mem
        changed = False
        if labels != self._mem_labels:
            changed = True
            for b in self._mem_bars:
                for patch in b.patches:
                    self.chart.forget(patch)
                b.remove()
            self._mem_bars = []
            x = list(range(len(labels)))
            if labels:
                for dx, color, name in (
                    (-0.2, "#1565c0", "measured"),
                    (0.2, "#bdbdbd", "predicted"),
                ):
                    bars = ax.bar(
                        [i + dx for i in x], [0.0] * len(x), width=0.4, color=color, label=name
                    )
                    self.chart.animate(*bars.patches)
                    self._mem_bars.append(bars)
                ax.set_xticks(x)
                ax.set_xticklabels(labels, fontsize=8)
                ax.legend(loc="upper right", fontsize=7)
            self._mem_labels = labels
        if self._mem_empty.get_visible() == bool(labels):
            self._mem_empty.set_visible(not labels)
            changed = True
        if not labels:
            return changed
        largest = max(max(p[1] or 0, p[2] or 0) for p in pairs)
        unit_name, unit = ("GiB", GIB) if largest >= GIB else ("MiB", 1 << 20)
        if unit != self._mem_unit:
            self._mem_unit = unit
            ax.set_title(f"memory: measured vs predicted ({unit_name})", fontsize=10)
            changed = True
        for (_, measured, predicted), mbar, pbar in zip(
            pairs, self._mem_bars[0].patches, self._mem_bars[1].patches, strict=True
        ):
            mbar.set_height((measured or 0) / unit)
            pbar.set_height((predicted or 0) / unit)
        top = largest / unit * 1.45 if largest > 0 else 1.0  # headroom for the legend
        lo, hi = ax.get_ylim()
        if not (largest / unit * 1.4 <= hi <= top * 1.5):  # re-scale only when far off
            ax.set_ylim(0, top)
            changed = True
        return changed

    def memory_chart_data(self) -> dict[str, list[Any]]:
        """The measured and predicted memory bars now drawn, converted back to bytes."""
        if not self._mem_bars:
            return {"labels": [], "measured": [], "predicted": []}
        u = self._mem_unit
        return {
            "labels": list(self._mem_labels),
            "measured": [p.get_height() * u for p in self._mem_bars[0].patches],
            "predicted": [p.get_height() * u for p in self._mem_bars[1].patches],
        }

    def charts(self) -> list[Chart]:
        return [self.chart]


def recent_rate(records: list[Any]) -> str | None:
    """The status line's throughput: the samples of the recent steps over their seconds
    (`workbench.rates.recent`: the last 20, or those since the last settings change), said
    with how many steps it covers; one step's rate would swing with a loader's bursts.
    None without a step of positive time."""
    from workbench.rates import recent, throughput

    window = recent(records)
    rate = throughput(window).samples_per_s
    if rate is None:
        return None
    n = len(window)
    return f"{rate:.1f} samples/s over the last {n} step" + ("" if n == 1 else "s")


def peak_pair(record: Any, predicted: Any) -> list[tuple[str, float | None, float | None]]:
    """("peak of a step", the newest step's CUDA peak (`torch.cuda.max_memory_allocated`
    over that step; None on a CPU), the predicted peak of a step); [] without either."""
    measured = getattr(record, "cuda_max_allocated_bytes", None) if record is not None else None
    peak = getattr(predicted, "peak_bytes", None) if predicted is not None else None
    if measured is None and not peak:
        return []
    return [("peak of a step", measured, peak)]


def report_pairs(report: Any) -> list[tuple[str, float | None, float | None]]:
    """(what, measured, predicted) bytes from a `session.memory()` report
    (`workbench.train.measure.memory.MemoryReport`: measured bytes in its own fields, the
    prediction in `predicted`, the comparable activation figure in
    `predicted_activation_bytes`)."""
    if report is None:
        return []
    predicted = report.predicted
    out = []
    for label, name in (
        ("parameters", "params_bytes"),
        ("gradients", "grads_bytes"),
        ("optimizer", "optimizer_bytes"),
        ("activations", "activation_bytes"),
    ):
        if name == "activation_bytes":
            pv = report.predicted_activation_bytes
        else:
            pv = getattr(predicted, name, None) if predicted is not None else None
        out.append((label, getattr(report, name), pv))
    dry = getattr(report, "dry_run", None)
    if dry is not None:  # Session.simulate(): measured on fake tensors, beside the formula
        peak = getattr(predicted, "peak_bytes", None) if predicted is not None else None
        out.append(("peak (dry run)", dry.peak_bytes, peak))
    return out


def report_matches(report: Any, cfg: Any) -> bool:
    """True when a memory report was measured with the settings `cfg` now has."""
    for name, key in (
        ("micro_batch", "micro_batch"),
        ("precision", "precision"),
        ("optimizer", "optimizer"),
        ("activation_checkpointing", "activation_checkpointing"),
    ):
        have = getattr(report, name, None)
        if have is not None and str(have) != str(plain(getattr(cfg, key))):
            return False
    return True


def memory_summary(report: Any) -> str:
    """One line of a memory report: measured and predicted MiB of each part."""
    pairs = report_pairs(report)
    if not pairs:
        return "no figures"
    parts = []
    for label, measured, predicted in pairs:
        m = "n/a" if measured is None else f"{measured / (1 << 20):.1f} MiB"
        p = "n/a" if predicted is None else f"{predicted / (1 << 20):.1f} MiB"
        parts.append(f"{label} {m} (predicted {p})")
    return "; ".join(parts)


def sticky_limits(ax: Any, xs: list[int], ys: list[float], *, from_zero: bool) -> bool:
    """Set axis limits that contain the data and change rarely (so the cached chart
    background stays valid for many redraws). True when they changed."""
    changed = False
    x0, x1 = ax.get_xlim()
    if xs:
        first, last = xs[0], xs[-1]
        if last > x1 or first < x0 or (first - x0) > 0.25 * (x1 - x0):
            span = max(10.0, (last - first) * 1.5)
            ax.set_xlim(first, first + span)
            changed = True
    finite = [y for y in ys if math.isfinite(y)]
    if finite:
        lo, hi = (0.0 if from_zero else min(finite)), max(finite)
        y0, y1 = ax.get_ylim()
        span = hi - lo or abs(hi) * 0.1 or 1.0
        outside = lo < y0 or hi > y1
        loose = (hi - lo) < 0.4 * (y1 - y0) and len(finite) > 10
        if outside or loose:
            pad = 0.1 * span
            ax.set_ylim(lo if from_zero else lo - pad, hi + pad)
            changed = True
    return changed
