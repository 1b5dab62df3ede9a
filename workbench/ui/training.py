"""TrainingPanel: controls bound to `Session.update()`, buttons, live charts, advice.

The panel never trains. Controls call `session.update(field=value)`; a rejected value
shows the session's message beside the control and leaves the session unchanged.
A refresh timer (at most 4 Hz) reads `session.records_since(n)`, `session.state`,
`session.events` and `session.memory()` snapshots and redraws one persistent figure:
loss, samples/s, the step time split into data and compute, and memory measured vs
predicted; a dotted vertical line marks each step where a settings change took effect.

The charts show the whole run, downsampled (`workbench.ui.charts.Downsampled`: each
bucket of steps keeps its lowest and highest value, so a spike is never hidden), and the
panel keeps only the newest records: its memory and a redraw cost the same at a thousand
steps and at a million.

Past 600 lines because the controls, the refresh timer and the figure share one state (the
records cursor, the artists being updated); drawing helpers live in `ui/charts.py`, field
parsing in `ui/fields.py`.
"""

from __future__ import annotations

import contextlib
import html
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from workbench.config import SETTINGS, setting_choices
from workbench.ui.charts import Chart, Downsampled
from workbench.ui.fields import (
    GIB,
    Field,
    dropdown_field,
    parse_float,
    parse_int,
    status_html,
    strip_tags,
    text_field,
)
from workbench.ui.panel import PanelBase, RefreshTimer

MEMORY_FIELDS = frozenset(
    {
        "precision",
        "micro_batch",
        "zero_stage",
        "fsdp",
        "offload_optimizer",
        "offload_params",
        "activation_checkpointing",
        "optimizer",
    }
)
KEPT_RECORDS = 500  # newest records the panel keeps (status line, advisor)
#: chart series, by the StepRecord field each plots
SERIES = ("loss", "samples_per_s", "data_seconds", "step_seconds")
DRAW_DUTY = 0.03  # charts may take at most this share of wall time
MAX_DRAW_WAIT_SECONDS = 5.0  # longest pause between redraws while data changes
ADVICE_EVERY_SECONDS = 2.0
STATUS_KEYS = (
    "precision",
    "micro_batch",
    "grad_accum",
    "zero_stage",
    "fsdp",
    "offload_optimizer",
    "offload_params",
    "clip_grad_norm",
    "activation_checkpointing",
    "num_workers",
    "lr",
    "lr_schedule",
)


@dataclass(frozen=True)
class Control:
    name: str  # TrainConfig field
    label: str
    kind: str  # "int" | "float" | "optional-float" | "choice" | "bool"
    options: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None


def _controls() -> tuple[Control, ...]:
    """The panel's controls, made from the TrainConfig fields that declare a panel place
    (`workbench.config.Setting.panel`): label, kind, choices and limits as declared there."""
    out = []
    for name, spec in SETTINGS.items():
        if spec.panel is None:
            continue
        low = spec.minimum if spec.minimum is not None else spec.above
        if spec.kind == "choice":
            out.append(
                (
                    spec.panel,
                    Control(name, spec.label, "choice", tuple(setting_choices(name))),
                )
            )
        elif spec.values:
            out.append((spec.panel, Control(name, spec.label, "choice", spec.values)))
        elif spec.kind == "bool":
            out.append((spec.panel, Control(name, spec.label, "bool")))
        else:
            kind = "optional-float" if spec.kind == "float" and spec.optional else spec.kind
            out.append(
                (spec.panel, Control(name, spec.label, kind, minimum=low, maximum=spec.maximum))
            )
    return tuple(control for _, control in sorted(out, key=lambda item: item[0]))


CONTROLS: tuple[Control, ...] = _controls()


def _plain(v: Any) -> Any:
    return getattr(v, "value", v) if not isinstance(v, (bool, int, float, str)) else v


def _fmt_value(v: Any) -> str:
    v = _plain(v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _state_name(state: Any) -> str:
    return str(getattr(state, "value", state)).lower()


class TrainingPanel(PanelBase):
    """Live view and controls of a `workbench.Session`.

    `controls[name]` are the setting fields (TrainConfig names), `buttons[name]` the
    actions (start, pause, resume, stop, save, profile, memory), `message` the last
    feedback, `status` the status line, `advice` the advisor's current list.
    `refresh()` runs one timer tick on the calling thread; the timer calls it every
    `refresh_s` seconds (>= 0.25) and redraws the charts within a small CPU budget.
    `close()` stops the timer; the session is left as it is.

    With `measure_memory` (the default) the panel measures memory once on a probe
    micro-batch (`session.memory()`, off the kernel's thread) when the first step records
    arrive, so the memory chart pairs measured and predicted activations as well as model
    states without a click; it measures again after a change of a memory setting. These
    automatic measurements leave the message line alone; a failure is kept in
    `memory_error` and the chart falls back to the step records' model states.
    """

    def __init__(
        self,
        session: Any,
        *,
        sampler: Any | None = None,
        refresh_s: float = 0.5,
        autostart: bool = True,
        measure_memory: bool = True,
    ) -> None:
        super().__init__()
        for name in ("config", "update", "records_since", "state", "start", "stop"):
            if not hasattr(session, name):
                raise ValueError(
                    f"session={session!r}: must be a workbench.Session (missing {name!r})"
                )
        self.session = session
        self.sampler = sampler
        self._lock = threading.RLock()
        self._sync_owner: int | None = None
        self._closing = False

        # ------------------------------------------------------------ controls
        self.controls: dict[str, Field] = {}
        cfg = session.config
        for c in CONTROLS:
            css = f"wb-train-{c.name.replace('_', '-')}"
            value = _plain(getattr(cfg, c.name))
            if c.kind == "choice":
                field = dropdown_field(c.label, c.options, value, css)
            elif c.kind == "bool":
                field = Field(c.label, widgets.Checkbox(value=bool(value), indent=False), css)
            else:
                field = text_field(c.label, "" if value is None else _fmt_value(value), css)
                if c.kind == "optional-float":
                    field.widget.placeholder = "empty: no clipping"
            field.widget.observe(self._control_handler(c), names="value")
            self.controls[c.name] = field
        self._shown_config = {c.name: _plain(getattr(cfg, c.name)) for c in CONTROLS}

        # ------------------------------------------------------------ buttons
        self.buttons: dict[str, widgets.Button] = {}
        for name, label, icon, style in (
            ("start", "start", "play", "success"),
            ("pause", "pause", "pause", ""),
            ("resume", "resume", "play", ""),
            ("stop", "stop", "stop", "danger"),
            ("save", "save checkpoint", "save", ""),
            ("profile", "profile 3 steps", "tachometer", ""),
            ("memory", "measure memory", "microchip", ""),
        ):
            b = widgets.Button(
                description=label,
                icon=icon,
                button_style=style,
                layout=widgets.Layout(width="auto", min_width="90px", flex="0 0 auto"),
            )
            b.add_class(f"wb-train-btn-{name}")
            b.on_click(self._button_handler(name))
            self.buttons[name] = b
        self._task_thread: threading.Thread | None = None  # profile / memory probe
        self.memory_report: Any | None = None  # last session.memory() result
        self.memory_error: str | None = None  # why the last automatic measurement failed
        # measure once (activations included) when the first step records arrive
        self._measure_memory = measure_memory and callable(getattr(session, "memory", None))
        self._predicted: tuple[Any, Any] | None = None  # (config, MemoryEstimate | None)
        self._version_seen: int | None = None

        # ------------------------------------------------------------ outputs
        self.status = widgets.HTML()
        self.status.add_class("wb-train-status")
        self.message = widgets.HTML()
        self.message.add_class("wb-train-message")
        self.events_html = widgets.HTML()
        self.profile_html = widgets.HTML()
        self.profile_result: Any | None = None
        self.events_html.add_class("wb-train-events")
        self.advice_box = widgets.VBox()
        self.advice_box.add_class("wb-train-advice")
        self.advice: list[Any] = []
        self._advice_rows: dict[str, tuple[widgets.HTML, widgets.Button]] = {}
        self._last_advice_time = 0.0
        self.records: list[Any] = []  # the newest KEPT_RECORDS
        self.series = {name: Downsampled() for name in SERIES}
        self._cursor = 0  # records_since cursor: records the session published so far
        self._last_step: int | None = None
        self.change_steps: list[tuple[int, str]] = []  # (step, "grad_accum=8")
        self._events_seen = 0
        self._events: list[Any] = []
        self.chart = Chart(11.0, 5.8, dpi=80, css="wb-train-chart")
        self._build_chart()
        self._dirty = True
        self._auto_probe = False
        self._next_draw = 0.0
        self._last_state: str | None = None

        names = list(self.controls)
        half = (len(names) + 1) // 2
        columns = [
            widgets.VBox(
                [self.controls[n].box for n in part], layout=widgets.Layout(margin="0 18px 0 0")
            )
            for part in (names[:half], names[half:])
        ]
        wrap = widgets.Layout(flex_flow="row wrap", align_items="flex-start")
        self.widget = widgets.VBox(
            [
                widgets.HBox(list(self.buttons.values()), layout=wrap),
                self.status,
                self.message,
                self.profile_html,
                self.chart.image,
                widgets.HTML(
                    "<b>Settings</b> (each change takes effect at the next optimizer step)"
                ),
                widgets.HBox(columns, layout=wrap),
                widgets.HTML("<b>Advice</b>"),
                self.advice_box,
                self.events_html,
            ],
            layout=widgets.Layout(padding="6px"),
        )
        self.widget.add_class("wb-training-panel")

        self.refresh()
        self.timer = RefreshTimer(
            self.refresh, refresh_s, name="workbench-ui-training", on_error=self._on_timer_error
        )
        if autostart:
            self.timer.start()

    # ================================================================= controls
    def _control_handler(self, c: Control) -> Callable[[dict[str, Any]], None]:
        def handler(change: dict[str, Any]) -> None:
            if self._sync_owner == threading.get_ident():
                return  # the panel itself is showing the session's value
            with self._lock:
                try:
                    self._apply_control(c, change["new"])
                except Exception as exc:  # never a traceback in the output
                    self._say("error", f"{c.label}: {exc}")

        return handler

    def _parse(self, c: Control, raw: Any) -> Any:
        if c.kind == "int":
            return parse_int(
                c.label,
                str(raw),
                minimum=int(c.minimum or 0),
                maximum=None if c.maximum is None else int(c.maximum),
            )
        if c.kind == "float":
            return parse_float(
                c.label, str(raw), minimum=c.minimum, maximum=c.maximum, exclusive_minimum=True
            )
        if c.kind == "optional-float":
            return parse_float(
                c.label,
                str(raw),
                minimum=c.minimum,
                maximum=c.maximum,
                exclusive_minimum=True,
                optional=True,
            )
        return raw

    def _apply_control(self, c: Control, raw: Any) -> None:
        field = self.controls[c.name]
        try:
            value = self._parse(c, raw)
        except ValueError as exc:
            field.set_error(str(exc))
            self._say("error", f"not applied: {exc}")
            return
        current = _plain(getattr(self.session.config, c.name))
        try:
            self.session.update(**{c.name: value})
        except ValueError as exc:
            msg = _one_line(exc)
            field.set_error(msg)
            self._say("error", f"not applied: {msg}")
            if c.kind in ("choice", "bool"):
                self._show_value(c, current)  # the control shows what the session runs
            return
        field.set_error(None)
        pending = getattr(self.session, "pending_changes", None)
        if pending is not None and c.name not in pending:
            self._say("ok", f"{c.name}={_fmt_value(value)} applied")
        else:
            self._say(
                "ok",
                f"{c.name}={_fmt_value(value)} queued; it takes effect at the next optimizer step",
            )

    def _show_value(self, c: Control, value: Any) -> None:
        w = self.controls[c.name].widget
        shown = value
        if c.kind not in ("choice", "bool"):
            shown = "" if value is None else _fmt_value(value)
        self._sync_owner = threading.get_ident()
        try:
            if w.value != shown:
                w.value = shown
        finally:
            self._sync_owner = None

    def _sync_controls(self) -> None:
        """Show settings the session changed by other means (code, advice, rollback)."""
        cfg = self.session.config
        for c in CONTROLS:
            now = _plain(getattr(cfg, c.name))
            if self._shown_config.get(c.name) != now:
                self._shown_config[c.name] = now
                self._show_value(c, now)
                self.controls[c.name].set_error(None)

    # ================================================================= buttons
    def _button_handler(self, name: str) -> Callable[[widgets.Button], None]:
        def handler(_b: widgets.Button) -> None:
            with self._lock:
                try:
                    self._do(name)
                except Exception as exc:  # wrong state etc.: a message, no traceback
                    self._say("error", f"{name}: {_one_line(exc)}")
            self._dirty = True

        return handler

    def _do(self, name: str) -> None:
        s = self.session
        state = _state_name(s.state)
        if name == "start":
            if state in ("running", "paused"):
                raise RuntimeError(f"already started (state: {state}); use pause/resume/stop")
            s.start()
            self._say("ok", "started")
        elif name == "pause":
            if state != "running":
                raise RuntimeError(f"only a running session can pause (state: {state})")
            s.pause(wait=False)  # the kernel does not wait for the step to finish
            self._say("ok", "pause requested; the loop stops at the next optimizer step")
        elif name == "resume":
            if state not in ("paused", "error"):
                raise RuntimeError(f"only a paused or failed session can resume (state: {state})")
            s.resume()
            self._say("ok", "resumed")
        elif name == "stop":
            if state not in ("running", "paused", "error"):
                raise RuntimeError(f"nothing to stop (state: {state})")
            s.stop()
            self._say("ok", "stopped")
        elif name == "save":
            # without a checkpoint_dir in the config, save under ./checkpoints
            target = None if s.config.checkpoint_dir else "checkpoints"
            path = s.save_checkpoint() if target is None else s.save_checkpoint(target)
            self._say("ok", f"checkpoint saved: {path}")
        elif name == "profile":
            self._run_task("profile", self._profile_task)
        elif name == "memory":
            self._run_task("measure memory", self._memory_task)
        else:  # pragma: no cover - buttons are fixed above
            raise ValueError(f"unknown action {name!r}")

    def _run_task(self, label: str, fn: Callable[[], None], *, quiet: bool = False) -> None:
        """Run a slow session call (profile, memory probe) off the kernel's thread."""
        if self._task_thread is not None and self._task_thread.is_alive():
            raise RuntimeError("another profile or memory measurement is still running")

        def run() -> None:
            try:
                fn()
            except Exception as exc:
                if quiet:
                    self.memory_error = f"{label}: {_one_line(exc)}"
                else:
                    self._say("error", f"{label}: {_one_line(exc)}")
            self._dirty = True

        self._task_thread = threading.Thread(target=run, name="workbench-ui-task", daemon=True)
        self._task_thread.start()

    def _profile_task(self) -> None:
        self._say("info", "profiling 3 steps ...")
        result = self.session.profile(steps=3)
        self.profile_result = result
        self._say("ok", f"profile: {_summarize(result)}")
        table = getattr(result, "table", None)
        if isinstance(table, str) and table:
            self.profile_html.value = (
                "<details><summary>profile: top operators</summary><pre style='font-size:11px'>"
                f"{html.escape(table)}</pre></details>"
            )

    def _memory_task(self) -> None:
        self._say("info", "measuring memory on one probe micro-batch ...")
        self.memory_report = self.session.memory()
        self.memory_error = None
        self._say("ok", "memory measured: " + _memory_summary(self.memory_report))

    def _quiet_memory_task(self) -> None:
        self.memory_report = self.session.memory()
        self.memory_error = None

    def wait_for_tasks(self, timeout: float | None = 60) -> None:
        """Wait for a running profile or memory measurement to finish."""
        t = self._task_thread
        if t is not None:
            t.join(timeout)

    def _say(self, kind: str, text: str) -> None:
        self.message.value = status_html(kind, text)

    @property
    def message_text(self) -> str:
        return strip_tags(self.message.value)

    @property
    def status_text(self) -> str:
        return strip_tags(self.status.value)

    def errors(self) -> dict[str, str]:
        """Messages now shown beside controls, by TrainConfig field name."""
        return {n: f.error_text for n, f in self.controls.items() if f.error_text}

    # ================================================================= charts
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
        if report is not None and _report_matches(report, cfg):
            return _memory_pairs(report)
        rec = self.records[-1] if self.records else None
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
        return pairs

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
            changed |= _sticky_limits(ax, xs, ys, from_zero=zero)
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

    # ================================================================= refresh
    def refresh(self, *, draw_now: bool = False) -> None:
        """One tick: read new records/events/state, update the view; redraw the charts if
        anything changed and the drawing budget allows (`draw_now`: ignore the budget)."""
        if self._closing:
            return
        s = self.session
        version = getattr(s, "version", None)
        state = _state_name(s.state)
        if (
            version is not None
            and version == self._version_seen
            and state == self._last_state
            and not self._dirty
        ):
            return  # nothing new: no work on the kernel while training runs
        self._version_seen = version
        new = self._new_records()
        if new:
            self.records = (self.records + new)[-KEPT_RECORDS:]
            for r in new:
                for name, series in self.series.items():
                    series.append(r.step, getattr(r, name, None))
                changes = getattr(r, "changes", None) or {}
                if changes:
                    text = ", ".join(f"{k}={_fmt_value(v)}" for k, v in changes.items())
                    self.change_steps.append((r.step, text))
                    if self.memory_report is not None and set(changes) & MEMORY_FIELDS:
                        self._auto_probe = True
            if self._measure_memory and self.memory_report is None:
                self._measure_memory = False  # once; later probes follow memory changes
                self._auto_probe = True
            self._dirty = True
        if state != self._last_state:
            self._last_state = state
            self._dirty = True
        with self._lock:
            self._sync_controls()
        self._update_events()
        self._update_status(state)
        now = time.monotonic()
        if new and now - self._last_advice_time >= ADVICE_EVERY_SECONDS:
            self._last_advice_time = now
            self._update_advice()
        if (self._dirty or not self.chart.png) and (draw_now or now >= self._next_draw):
            # drawing shares the CPU (and the GIL) with training: keep it to a small
            # share of wall time, at most once per tick
            self._dirty = False
            start = time.perf_counter()
            self._draw()
            cost = time.perf_counter() - start
            self._next_draw = now + min(cost / DRAW_DUTY, MAX_DRAW_WAIT_SECONDS)
        if self._auto_probe and state not in ("closed", "error"):
            # measure activations next to the prediction without a click, and keep the
            # measurement in step with the settings; quiet: the message line stays the user's
            self._auto_probe = False
            with contextlib.suppress(RuntimeError):
                self._run_task("measure memory", self._quiet_memory_task, quiet=True)

    def _new_records(self) -> list[Any]:
        """Records the session published since the last tick. The cursor is the session's
        count of published records (`history.total`), read before the records so a record
        published in between comes again next time; a repeat is dropped by its step."""
        s = self.session
        total = getattr(getattr(s, "history", None), "total", None)
        new = list(s.records_since(self._cursor))
        self._cursor = int(total) if isinstance(total, int) else self._cursor + len(new)
        if self._last_step is not None:
            new = [r for r in new if r.step > self._last_step]
        if new:
            self._last_step = new[-1].step
        return new

    def _update_status(self, state: str) -> None:
        cfg = self.session.config
        parts = [state]
        if self.records:
            r = self.records[-1]
            parts.append(f"step {r.step}")
            if r.loss is not None and math.isfinite(r.loss):
                parts.append(f"loss {r.loss:.4f}")
            parts.append(f"{r.samples_per_s:.1f} samples/s")
        if self.change_steps:
            step, text = self.change_steps[-1]
            parts.append(f"last change at step {step}: {text}")
        settings = " ".join(f"{k}={_fmt_value(getattr(cfg, k))}" for k in STATUS_KEYS)
        kind = {"running": "ok", "error": "error", "paused": "warning"}.get(state, "info")
        pending = getattr(self.session, "pending_changes", None) or {}
        if pending:
            parts.append(
                "pending: " + ", ".join(f"{k}={_fmt_value(v)}" for k, v in pending.items())
            )
        text = " · ".join(parts)
        failure = getattr(self.session, "failure", None)
        if state in ("error", "paused") and failure:
            text += f" · {_one_line(failure)}"
        value = status_html(kind, text) + f"<br><code>{html.escape(settings)}</code>"
        if self.status.value != value:
            self.status.value = value

    def _update_events(self) -> None:
        since = getattr(self.session, "events_since", None)
        if since is not None:
            new = list(since(self._events_seen))
        else:
            new = list(getattr(self.session, "events", ()) or ())[self._events_seen :]
        if not new:
            return
        for ev in new:
            if getattr(ev, "kind", "") == "change-failed":
                self._shown_config = {}  # re-show every setting the session now runs
        self._events_seen += len(new)
        self._events = (self._events + new)[-20:]
        rows = []
        for ev in self._events[-6:]:
            sev = getattr(ev, "severity", "info")
            kind = {"error": "error", "warning": "warning"}.get(sev, "info")
            rows.append(status_html(kind, f"step {ev.step}: {ev.kind}: {ev.message}"))
        self.events_html.value = "<br>".join(rows)

    def _update_advice(self) -> None:
        try:
            from workbench.advisor import advise

            samples = self.sampler.history() if self.sampler is not None else None
            advice = advise(
                self.records[-500:],
                samples=samples,
                config=self.session.config,
                gpu_uuid=getattr(self.session, "gpu_uuid", None),
            )
        except Exception as exc:
            self.advice = []
            self.advice_box.children = (
                widgets.HTML(status_html("warning", f"advisor unavailable: {_one_line(exc)}")),
            )
            return
        self.advice = advice
        ids = [a.id for a in advice]
        if ids != list(self._advice_rows):
            rows = {}
            for a in advice:
                text = widgets.HTML()
                button = widgets.Button(description="apply", layout=widgets.Layout(width="80px"))
                button.add_class(f"wb-advice-apply-{a.id}")
                button.on_click(self._advice_handler(a.id))
                rows[a.id] = (text, button)
            self._advice_rows = rows
            self.advice_box.children = tuple(
                widgets.HBox([t, b]) if a.apply else widgets.HBox([t])
                for a, (t, b) in zip(advice, rows.values(), strict=True)
            )
        for a in advice:
            text, _ = self._advice_rows[a.id]
            kind = {"critical": "error", "warning": "warning"}.get(a.severity, "info")
            extra = ""
            if a.apply:
                extra = " → " + ", ".join(f"{k}={_fmt_value(v)}" for k, v in a.apply.items())
            value = status_html(kind, f"[{a.severity}] {a.message}{extra}")
            if text.value != value:
                text.value = value

    def _advice_handler(self, advice_id: str) -> Callable[[widgets.Button], None]:
        def handler(_b: widgets.Button) -> None:
            with self._lock:
                self.apply_advice(advice_id)

        return handler

    def apply_advice(self, advice_id: str) -> bool:
        """Hand the advice's settings change to `session.update`; False with a message when
        the advice is gone or the session rejects it."""
        match = [a for a in self.advice if a.id == advice_id]
        if not match or not match[0].apply:
            self._say("error", f"advice {advice_id!r}: no change to apply")
            return False
        change = dict(match[0].apply)
        try:
            self.session.update(**change)
        except Exception as exc:
            self._say("error", f"advice {advice_id!r} not applied: {_one_line(exc)}")
            return False
        self._say(
            "ok", "applied advice: " + ", ".join(f"{k}={_fmt_value(v)}" for k, v in change.items())
        )
        return True

    def _on_timer_error(self, exc: BaseException) -> None:
        self._say("error", f"refresh failed: {type(exc).__name__}: {_one_line(exc)}")

    # ================================================================= lifecycle
    def close(self) -> None:
        """Stop the refresh timer and close the widgets. The session keeps running:
        close it with `session.close()` (a dashboard closes a session it created)."""
        if self.closed:
            return
        self._closing = True
        self.timer.stop()
        t = self._task_thread
        if t is not None and t.is_alive():
            t.join(timeout=60)
        super().close()

    def __repr__(self) -> str:
        state = _state_name(self.session.state)
        return f"TrainingPanel(state={state!r}, records={len(self.records)})"


def _one_line(exc: Any) -> str:
    text = str(exc).strip()
    lines = [x.strip(" -") for x in text.splitlines() if x.strip()]
    return "; ".join(lines) if lines else type(exc).__name__


def _summarize(result: Any) -> str:
    """One line from a `ProfileResult` (mean step time, phase shares, top operator)."""
    if result is None:
        return "done"
    shares = getattr(result, "phase_shares", None)
    step_s = getattr(result, "step_seconds", None)
    if isinstance(shares, dict) and step_s is not None:
        text = f"{result.steps} steps, {step_s * 1000:.1f} ms per step: " + ", ".join(
            f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])
        )
        ops = getattr(result, "operators", ())
        if ops:
            text += f"; top operator {ops[0].name} ({ops[0].self_cpu_seconds * 1000:.1f} ms self)"
        trace = getattr(result, "trace_path", None)
        if trace:
            text += f"; trace: {trace}"
        return text
    text = str(result)
    return text if len(text) < 300 else text[:297] + "..."


def _memory_pairs(report: Any) -> list[tuple[str, float | None, float | None]]:
    """(what, measured, predicted) bytes from a `session.memory()` report
    (`workbench.train.memory.MemoryReport`: measured bytes in its own fields, the
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
    return out


def _report_matches(report: Any, cfg: Any) -> bool:
    """True when a memory report was measured with the settings `cfg` now has."""
    for name, key in (
        ("micro_batch", "micro_batch"),
        ("precision", "precision"),
        ("optimizer", "optimizer"),
        ("activation_checkpointing", "activation_checkpointing"),
    ):
        have = getattr(report, name, None)
        if have is not None and str(have) != str(_plain(getattr(cfg, key))):
            return False
    return True


def _memory_summary(report: Any) -> str:
    pairs = _memory_pairs(report)
    if not pairs:
        return "no figures"
    parts = []
    for label, measured, predicted in pairs:
        m = "n/a" if measured is None else f"{measured / (1 << 20):.1f} MiB"
        p = "n/a" if predicted is None else f"{predicted / (1 << 20):.1f} MiB"
        parts.append(f"{label} {m} (predicted {p})")
    return "; ".join(parts)


def _sticky_limits(ax: Any, xs: list[int], ys: list[float], *, from_zero: bool) -> bool:
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
