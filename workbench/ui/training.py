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

The parts: `ui/training_controls.py` (the setting controls, their widgets and parsing),
`ui/training_charts.py` (the figure, drawn from this panel's state), `ui/charts.py` and
`ui/fields.py` (the drawing and field helpers every panel uses). `Control` and `CONTROLS`
are importable from here too.
"""

from __future__ import annotations

import contextlib
import html
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from workbench.config import SETTINGS
from workbench.display import fmt_bytes
from workbench.inputs import shown
from workbench.ui.charts import Chart, Downsampled
from workbench.ui.fields import Field, status_html, strip_tags
from workbench.ui.panel import PanelBase, RefreshTimer
from workbench.ui.training_charts import TrainingCharts, memory_summary, recent_rate
from workbench.ui.training_controls import (
    CONTROLS,
    Control,
    control_field,
    fmt_value,
    parse_control,
    plain,
)

__all__ = ["CONTROLS", "Control", "TrainingPanel"]

#: The settings whose change moves the memory prediction (`Setting.moves_memory`): the
#: panel measures memory again after one of them changes.
MEMORY_FIELDS = frozenset(name for name, spec in SETTINGS.items() if spec.moves_memory)
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
    "attention",
    "num_workers",
    "lr",
    "lr_schedule",
)


def _state_name(state: Any) -> str:
    return str(getattr(state, "value", state)).lower()


class TrainingPanel(TrainingCharts, PanelBase):
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
                    f"session={shown(session)}: must be a workbench.Session (missing {shown(name)})"
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
            field = control_field(c, plain(getattr(cfg, c.name)))
            field.widget.observe(self._control_handler(c), names="value")
            self.controls[c.name] = field
        self._shown_config = {c.name: plain(getattr(cfg, c.name)) for c in CONTROLS}

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
            ("dryrun", "dry run", "flask", ""),
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

    def _apply_control(self, c: Control, raw: Any) -> None:
        field = self.controls[c.name]
        try:
            value = parse_control(c, raw)
        except ValueError as exc:
            field.set_error(str(exc))
            self._say("error", f"not applied: {exc}")
            return
        current = plain(getattr(self.session.config, c.name))
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
            self._say("ok", f"{c.name}={fmt_value(value)} applied")
        else:
            self._say(
                "ok",
                f"{c.name}={fmt_value(value)} queued; it takes effect at the next optimizer step",
            )

    def _show_value(self, c: Control, value: Any) -> None:
        w = self.controls[c.name].widget
        shown = value
        if c.kind not in ("choice", "bool"):
            shown = "" if value is None else fmt_value(value)
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
            now = plain(getattr(cfg, c.name))
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
            # without a checkpoint_dir in the config, save under ./checkpoints/<run id>: a
            # folder of this run's own, so sessions saving from two panels never meet
            target = None if s.config.checkpoint_dir else str(Path("checkpoints") / s.run_id)
            path = s.save_checkpoint() if target is None else s.save_checkpoint(target)
            self._say("ok", f"checkpoint saved: {path}")
        elif name == "profile":
            self._run_task("profile", self._profile_task)
        elif name == "memory":
            self._run_task("measure memory", self._memory_task)
        elif name == "dryrun":
            if not callable(getattr(s, "simulate", None)):
                raise RuntimeError("this session has no dry run (Session.simulate)")
            self._run_task("dry run", self._dry_run_task)
        else:  # pragma: no cover - buttons are fixed above
            raise ValueError(f"unknown action {shown(name)}")

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
        self._say("ok", "memory measured: " + memory_summary(self.memory_report))

    def _dry_run_task(self) -> None:
        """`session.simulate()` off the kernel's thread, its progress in the message, then
        a memory report that shows the dry run's peak next to the formula's."""
        self._say("info", "dry run: real steps on fake tensors, nothing allocated ...")

        def progress(phase: str, step: int, steps: int) -> None:
            self._say("info", f"dry run: {phase}, step {step} of {steps} ...")

        run = self.session.simulate(progress=progress)
        self.memory_report = self.session.memory()
        self.memory_error = None
        formula = getattr(run, "formula", None)
        beside = f" (formula {fmt_bytes(formula.peak_bytes)})" if formula is not None else ""
        self._say(
            "ok",
            f"dry run: peak of a step {fmt_bytes(run.peak_bytes)} at the {run.phase}{beside}, "
            f"{run.wall_seconds:.1f} s",
        )

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

    # ================================================================= charts    # ================================================================= refresh
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
                    text = ", ".join(f"{k}={fmt_value(v)}" for k, v in changes.items())
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
            rate = recent_rate(self.records)
            if rate is not None:
                parts.append(rate)
        if self.change_steps:
            step, text = self.change_steps[-1]
            parts.append(f"last change at step {step}: {text}")
        settings = " ".join(f"{k}={fmt_value(getattr(cfg, k))}" for k in STATUS_KEYS)
        split = layout_text(self.session)
        if split:
            parts.append(split)
        kind = {"running": "ok", "error": "error", "paused": "warning"}.get(state, "info")
        pending = getattr(self.session, "pending_changes", None) or {}
        if pending:
            parts.append("pending: " + ", ".join(f"{k}={fmt_value(v)}" for k, v in pending.items()))
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
            memory = getattr(self.session, "memory_advice", None)
            if callable(memory):  # the technique that frees the most of the peak
                advice += memory()
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
                extra = " → " + ", ".join(f"{k}={fmt_value(v)}" for k, v in a.apply.items())
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
            self._say("error", f"advice {shown(advice_id)}: no change to apply")
            return False
        change = dict(match[0].apply)
        try:
            self.session.update(**change)
        except Exception as exc:
            self._say("error", f"advice {shown(advice_id)} not applied: {_one_line(exc)}")
            return False
        self._say(
            "ok", "applied advice: " + ", ".join(f"{k}={fmt_value(v)}" for k, v in change.items())
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


def layout_text(session: Any) -> str:
    """The split of the model as the status line shows it ("" when it is not split):
    "tensor parallel 2 (this rank 0) x data parallel 1", or for a pipeline "pipeline
    stage 0 of 2 (layers 0-1), 1f1b over 4 micro-batches, bubble 37% (ideal 20%) x data
    parallel 1"."""
    layout = getattr(session, "layout", None)
    try:
        split = layout() if callable(layout) else None
    except Exception:  # a closed session: nothing to show
        return ""
    if not split:
        return ""
    if split["pp"] > 1:
        layers = split.get("layers") or []
        span = f" (layers {layers[0]}-{layers[-1]})" if layers else ""
        text = f"pipeline stage {split['stage']} of {split['pp']}{span}"
        if split.get("schedule"):
            text += f", {split['schedule']} over {split['micro_batches']} micro-batches"
        bubble = split.get("bubble_measured")
        if isinstance(bubble, float) and split.get("step_seconds"):
            text += f", bubble {bubble:.0%} (ideal {split['bubble_ideal']:.0%})"
    else:
        text = f"tensor parallel {split['tp']} (this rank {split['tp_rank']})"
    return f"{text} x data parallel {split['dp']}"


def _one_line(exc: Any) -> str:
    """An error's text on one line: its lines joined by "; ", a heading ending in ":" by
    a space ("2 invalid settings: a=...; b=...")."""
    lines = [x.strip(" -") for x in str(exc).strip().splitlines() if x.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    for line in lines[1:]:
        text += (" " if text.endswith(":") else "; ") + line
    return text


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
            text += (
                f"; top operator {ops[0].name} ({ops[0].self_cpu_seconds * 1000:.1f} ms self, "
                f"over the {result.steps} steps)"
            )
        trace = getattr(result, "trace_path", None)
        if trace:
            text += f"; trace: {trace}"
        return text
    text = str(result)
    return text if len(text) < 300 else text[:297] + "..."
