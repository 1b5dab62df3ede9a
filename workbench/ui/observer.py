"""`ObserverPanel`: the training charts, settings (read-only) and advice of a run the
workbench observes (`workbench.integrations.Observer`: your HF Trainer, Lightning Trainer or
loop), and `ObserverDashboard`: that panel with the hardware monitor and the estimator.

The charts are the training panel's (`TrainingCharts`): loss, samples/s, the step time
split into the wait for data and compute, and memory measured next to the prediction for
the run's own settings. The settings are shown as your trainer names them, with the
workbench setting each was read as; they change in your trainer, not here, so the advice
says which argument to change (`Observer.advice`) and has no apply button.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from workbench.inputs import shown
from workbench.ui.charts import Chart, Downsampled
from workbench.ui.fields import status_html
from workbench.ui.panel import PanelBase, RefreshTimer, TabbedPanels
from workbench.ui.training_charts import TrainingCharts, recent_rate

SERIES = ("loss", "samples_per_s", "data_seconds", "step_seconds")
KEPT_RECORDS = 500
ADVICE_EVERY_SECONDS = 2.0


class ObserverPanel(PanelBase, TrainingCharts):
    """The observed run's charts, settings and advice (see the module docstring).
    `refresh()` runs one timer tick on the calling thread."""

    def __init__(
        self,
        observer: Any,
        *,
        sampler: Any | None = None,
        refresh_s: float = 0.5,
        autostart: bool = True,
    ) -> None:
        super().__init__()
        for name in ("config", "records_since", "predict", "advice", "history"):
            if not hasattr(observer, name):
                raise ValueError(
                    f"observer={shown(observer)}: must be a workbench.integrations.Observer "
                    f"(missing {shown(name)})"
                )
        self.session = observer  # what TrainingCharts reads: .config and .predict
        self.observer = observer
        self.sampler = sampler
        self._lock = threading.RLock()
        self.records: list[Any] = []
        self.series = {name: Downsampled() for name in SERIES}
        self.change_steps: list[tuple[int, str]] = []
        self.memory_report: Any | None = None
        self._predicted: tuple[Any, Any] | None = None
        self._cursor = 0
        #: called after each refresh (the dashboard puts the attached run into its tab)
        self.after_refresh: list[Callable[[], Any]] = []
        self._version_seen: int | None = None
        self._last_advice = 0.0
        self.advice: list[Any] = []
        self.chart = Chart(11.0, 5.8, dpi=80, css="wb-observe-chart")
        self._build_chart()
        self.status = widgets.HTML()
        self.status.add_class("wb-observe-status")
        self.settings_html = widgets.HTML(self._settings_html())
        self.settings_html.add_class("wb-observe-settings")
        self.advice_box = widgets.HTML()
        self.advice_box.add_class("wb-observe-advice")
        self.widget = widgets.VBox(
            [
                self.status,
                self.chart.image,
                widgets.HTML(
                    f"<b>Settings</b> (read from your {html.escape(observer.trainer_name)}; "
                    "change them there)"
                ),
                self.settings_html,
                widgets.HTML("<b>Advice</b>"),
                self.advice_box,
            ],
            layout=widgets.Layout(padding="6px"),
        )
        self.widget.add_class("wb-observer-panel")
        self.refresh(draw_now=True)
        self.timer = RefreshTimer(self.refresh, refresh_s, name="workbench-ui-observer")
        if autostart:
            self.timer.start()

    def _settings_html(self) -> str:
        obs = self.observer
        rows = "".join(
            f"<tr><td><code>{html.escape(str(k))}</code></td>"
            f"<td>{html.escape(repr(getattr(v, 'value', v)))}</td></tr>"
            for k, v in obs.read_from.items()
        )
        cfg = obs.config
        summary = (
            f"read as: {cfg.precision}, {cfg.optimizer}, micro-batch {cfg.micro_batch} x "
            f"{cfg.grad_accum} accumulation"
            + (f", ZeRO {cfg.zero_stage}" if cfg.zero_stage else "")
            + (f", FSDP {getattr(cfg.fsdp, 'value', cfg.fsdp)}" if str(cfg.fsdp) != "off" else "")
        )
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in obs.notes)
        return f"<table class='wb-observe-args'>{rows}</table><div>{html.escape(summary)}</div>" + (
            f"<ul>{notes}</ul>" if notes else ""
        )

    def refresh(self, *, draw_now: bool = False) -> None:
        """One tick: new records into the charts, the status line, the advice."""
        if self.closed:
            return
        obs = self.observer
        version = getattr(obs, "version", None)
        if version is not None and version == self._version_seen and not draw_now:
            return
        self._version_seen = version
        total = obs.history.total
        new = list(obs.records_since(self._cursor))
        self._cursor = int(total)
        if new:
            last = self.records[-1].step if self.records else 0
            new = [r for r in new if r.step > last]
            self.records = (self.records + new)[-KEPT_RECORDS:]
            for r in new:
                for name, series in self.series.items():
                    series.append(r.step, getattr(r, name, None))
        self.status.value = self._status()
        settings = self._settings_html()  # attached at the trainer's start
        if self.settings_html.value != settings:
            self.settings_html.value = settings
        now = time.monotonic()
        if new and (draw_now or now - self._last_advice >= ADVICE_EVERY_SECONDS):
            self._last_advice = now
            self._update_advice()
        with self._lock:
            self._draw()
        for hook in list(self.after_refresh):
            hook()

    def _status(self) -> str:
        obs = self.observer
        if not self.records:
            waiting = "no step yet" if obs.attached else "waiting for training to start"
            return status_html("info", f"observing your {obs.trainer_name}: {waiting}")
        r = self.records[-1]
        speed = recent_rate(self.records)
        # a loss the observer could not read is None: the notes below say why
        loss = f"loss {r.loss:.4g}" if r.loss is not None else "loss unknown (why: see Settings)"
        return status_html(
            "info",
            f"observing your {obs.trainer_name} ({obs.state}): step {r.step}, {loss}"
            + (f", {speed}" if speed else ""),
        )

    def _update_advice(self) -> None:
        try:
            samples = self.sampler.history() if self.sampler is not None else None
            self.advice = self.observer.advice(samples)
        except Exception as exc:
            self.advice = []
            self.advice_box.value = status_html("warning", f"advisor unavailable: {exc}")
            return
        if not self.advice:
            self.advice_box.value = status_html("info", "no advice yet")
            return
        self.advice_box.value = "".join(
            status_html(
                {"critical": "error", "warning": "warning"}.get(a.severity, "info"),
                f"[{a.severity}] {a.message}",
            )
            for a in self.advice
        )

    def charts(self) -> list[Chart]:
        return [self.chart]

    def close(self) -> None:
        if self.closed:
            return
        self.timer.stop()
        super().close()

    def __repr__(self) -> str:
        return f"ObserverPanel({self.observer!r})"


def estimator_values(observer: Any) -> dict[str, Any]:
    """The estimator panel's inputs for the observed run: its model's shape (or count) and
    its settings, so the tab opens on the run itself."""
    from workbench.ui.estimator import MODE_PARAMS, MODE_SHAPE

    cfg = observer.config
    values: dict[str, Any] = {
        "micro_batch": str(cfg.micro_batch),
        "precision": str(getattr(cfg.precision, "value", cfg.precision)),
        "zero_stage": int(cfg.zero_stage),
        "gpus": str(observer.world_size),
        "grad_accum": str(cfg.grad_accum),
        "checkpointing": str(cfg.activation_checkpointing),
    }
    optimizer = str(getattr(cfg.optimizer, "value", cfg.optimizer))
    if optimizer in ("adamw", "adam", "sgd", "sgd-nomomentum", "adam8bit", "paged-adam8bit"):
        values["optimizer"] = optimizer
    try:
        description = observer.description()
    except Exception:  # a model the counter cannot read: the panel's defaults
        return values
    n = description if isinstance(description, int) else getattr(description, "n_params", None)
    if isinstance(n, int):
        values["n_params"] = str(n)
    arch = getattr(description, "architecture", None)
    if arch is None:
        return {**values, "mode": MODE_PARAMS}
    for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
        values[name] = str(getattr(arch, name))
    return {**values, "mode": MODE_SHAPE}


class ObserverDashboard(TabbedPanels):
    """The observed run's panel, the hardware monitor and the estimator in tabs."""

    def __init__(self, observer: Any, sampler: Any | None = None) -> None:
        super().__init__()
        from workbench.ui.estimator import EstimatorPanel
        from workbench.ui.monitor import MonitorPanel

        self._owned: list[Any] = []
        if sampler is None:
            from workbench.monitor import Sampler

            sampler = Sampler(interval=0.5)
            self._owned.append(sampler)
        self.sampler = sampler
        try:
            self.training = ObserverPanel(observer, sampler=sampler)
            self.monitor = MonitorPanel(sampler)
            self.estimator = EstimatorPanel(**estimator_values(observer))
        except BaseException:
            for obj in self._owned:
                obj.close()
            raise
        self.tabs = widgets.Tab(
            children=[self.training.widget, self.monitor.widget, self.estimator.widget]
        )
        self.tabs.titles = ("Observed run", "Hardware monitor", "Memory estimator")
        self.widget = widgets.VBox([self.tabs])
        self.widget.add_class("wb-dashboard")
        #: the observed run's inputs last put into the estimator tab (None: its defaults)
        self._estimated_run: tuple[Any, ...] | None = None
        self.sync_estimator()
        self.training.after_refresh.append(self.sync_estimator)

    def sync_estimator(self) -> bool:
        """Put the observed run into the estimator tab: once the trainer hands its model
        over (a dashboard shown before `trainer.fit()` / `trainer.train()` opens on the
        panel's defaults until then), and again when what is read of the run changes. True
        when the tab changed."""
        observer = self.training.observer
        if not observer.attached:
            return False
        values = estimator_values(observer)
        key = tuple(sorted(values.items()))
        if key == self._estimated_run:
            return False
        self._estimated_run = key
        self.estimator.set_values(values)
        return True

    @property
    def panels(self) -> tuple[PanelBase, ...]:
        return (self.training, self.monitor, self.estimator)

    def __repr__(self) -> str:
        return f"ObserverDashboard({self.training.observer!r})"
