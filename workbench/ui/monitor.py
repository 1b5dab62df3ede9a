"""MonitorPanel: gauges and a short history chart over a `workbench.monitor.Sampler`.

With NVML (source "nvml") the gauges show each GPU's utilization, memory, power and
temperature; without it (source "host") they show host CPU, this process's RSS and
system memory, under a plain "No NVIDIA GPU" line that gives the sampler's reason.
A refresh timer reads `sampler.latest()` / `sampler.history()` snapshots only.
"""

from __future__ import annotations

import html
import time
from typing import Any

import ipywidgets as widgets

from workbench.inputs import shown
from workbench.ui.charts import Chart
from workbench.ui.fields import GIB, status_html
from workbench.ui.panel import PanelBase, RefreshTimer

HISTORY_SECONDS = 120.0


class Gauge:
    """A labelled progress bar with a value text; `set(fraction_percent, text)`."""

    def __init__(self, label: str, css: str) -> None:
        self.bar = widgets.FloatProgress(
            value=0.0, min=0.0, max=100.0, layout=widgets.Layout(width="220px")
        )
        self.bar.add_class(css)
        self.text = widgets.HTML("n/a", layout=widgets.Layout(width="230px"))
        self.text.add_class(f"{css}-text")
        self.box = widgets.HBox(
            [
                widgets.HTML(f"<b>{html.escape(label)}</b>", layout=widgets.Layout(width="150px")),
                self.bar,
                self.text,
            ],
            layout=widgets.Layout(align_items="center"),
        )

    def set(self, percent: float | None, text: str) -> None:
        value = 0.0 if percent is None else max(0.0, min(100.0, float(percent)))
        style = "success" if value < 70 else ("warning" if value < 90 else "danger")
        if self.bar.bar_style != style:
            self.bar.bar_style = style
        self.bar.value = value
        self.text.value = html.escape(text)


def _pct(used: float | None, total: float | None) -> float | None:
    if used is None or not total:
        return None
    return 100.0 * used / total


def _gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


class MonitorPanel(PanelBase):
    """Live hardware gauges. `sampler=None` starts (and owns) a `Sampler`; `close()`
    stops the refresh timer and closes an owned sampler."""

    def __init__(
        self, sampler: Any | None = None, *, refresh_s: float = 1.0, autostart: bool = True
    ) -> None:
        super().__init__()
        if sampler is None:
            from workbench.monitor import Sampler

            sampler = Sampler(interval=0.5)
            self._owns_sampler = True
        else:
            for name in ("latest", "history", "source"):
                if not hasattr(sampler, name):
                    raise ValueError(
                        f"sampler={shown(sampler)}: must be a workbench.monitor.Sampler "
                        f"(missing {shown(name)})"
                    )
            self._owns_sampler = False
        self.sampler = sampler
        self.header = widgets.HTML()
        self.header.add_class("wb-monitor-header")
        self.gauges: dict[str, Gauge] = {}
        self.gauge_box = widgets.VBox()
        self.chart = Chart(7.0, 2.4, css="wb-monitor-chart")
        ax = self.chart.figure.add_subplot(1, 1, 1)
        self.chart.figure.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.2)
        self._ax = ax
        ax.set_ylim(0, 105)  # a line at 100 % stays visible above the frame
        ax.set_ylabel("%")
        ax.set_xlabel("seconds ago")
        ax.grid(True, alpha=0.3)
        (self._line_util,) = ax.plot([], [], label="utilization", color="#1565c0")
        (self._line_mem,) = ax.plot([], [], label="memory", color="#ef6c00")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_xlim(-HISTORY_SECONDS, 0)
        self.chart.animate(self._line_util, self._line_mem)  # fixed axes: only lines redraw
        self._last_time: float | None = None
        self._layout_source: str | None = None
        self.widget = widgets.VBox(
            [self.header, self.gauge_box, self.chart.image],
            layout=widgets.Layout(padding="6px"),
        )
        self.widget.add_class("wb-monitor-panel")
        self.refresh()
        self.timer = RefreshTimer(self.refresh, refresh_s, name="workbench-ui-monitor")
        if autostart:
            self.timer.start()

    # ------------------------------------------------------------------ view
    def charts(self) -> list[Chart]:
        return [self.chart]

    def _ensure_gauges(self, source: str, n_gpus: int) -> None:
        key = f"{source}:{n_gpus}"
        if self._layout_source == key:
            return
        self.gauges = {}
        rows: list[widgets.Widget] = []
        if source == "nvml" and n_gpus:
            for i in range(n_gpus):
                for name, label in (
                    ("util", "utilization"),
                    ("memory", "memory"),
                    ("power", "power"),
                    ("temperature", "temperature"),
                ):
                    g = Gauge(f"GPU {i} {label}", f"wb-gauge-gpu{i}-{name}")
                    self.gauges[f"gpu{i}.{name}"] = g
                    rows.append(g.box)
        else:
            for name, label in (
                ("cpu", "CPU (all cores)"),
                ("rss", "process RSS"),
                ("memory", "system memory"),
            ):
                g = Gauge(label, f"wb-gauge-{name}")
                self.gauges[name] = g
                rows.append(g.box)
        self.gauge_box.children = tuple(rows)
        self._layout_source = key
        gpu = source == "nvml" and n_gpus
        self._ax.set_title(
            "GPU 0 utilization and memory" if gpu else "host CPU and memory", fontsize=10
        )
        self._line_util.set_label("GPU utilization" if gpu else "CPU utilization")
        self._line_mem.set_label("GPU memory" if gpu else "system memory")
        self._ax.legend(loc="upper left", fontsize=8)
        self.chart.invalidate()

    def refresh(self) -> None:
        """Read the sampler's newest snapshot and history; update gauges and chart."""
        sample = self.sampler.latest()
        if sample is None:
            self.header.value = status_html("info", "waiting for the first sample ...")
            self._ensure_gauges(getattr(self.sampler, "source", "host"), 0)
            if not self.chart.png:
                self.chart.render()
            return
        if sample.source == "nvml" and sample.gpus:
            names = ", ".join(f"GPU {g.index}: {g.name or 'unknown'}" for g in sample.gpus)
            self.header.value = status_html("ok", f"NVML: {names}")
        else:
            reason = sample.reason or getattr(self.sampler, "reason", None) or "NVML not used"
            self.header.value = status_html(
                "warning", f"No NVIDIA GPU: showing host CPU and memory ({reason})"
            )
        self._ensure_gauges(sample.source, len(sample.gpus) if sample.source == "nvml" else 0)
        self._set_gauges(sample)
        if sample.time != self._last_time:
            self._last_time = sample.time
            self._draw_history(sample.source)

    def _set_gauges(self, s: Any) -> None:
        g = self.gauges
        if s.source == "nvml" and s.gpus:
            for gpu in s.gpus:
                i = gpu.index
                if f"gpu{i}.util" not in g:
                    continue
                lost = " (lost)" if getattr(gpu, "lost", False) else ""
                util = gpu.util_percent
                g[f"gpu{i}.util"].set(util, ("n/a" if util is None else f"{util:.0f} %") + lost)
                g[f"gpu{i}.memory"].set(
                    _pct(gpu.memory_used_bytes, gpu.memory_total_bytes),
                    f"{_gib(gpu.memory_used_bytes)} / {_gib(gpu.memory_total_bytes)}",
                )
                pw, lim = gpu.power_watts, gpu.power_limit_watts
                g[f"gpu{i}.power"].set(
                    _pct(pw, lim),
                    ("n/a" if pw is None else f"{pw:.0f} W")
                    + ("" if lim is None else f" / {lim:.0f} W"),
                )
                t = gpu.temperature_c
                g[f"gpu{i}.temperature"].set(t, "n/a" if t is None else f"{t:.0f} °C")
        else:
            cpu = s.cpu_util_percent
            g["cpu"].set(cpu, "n/a" if cpu is None else f"{cpu:.0f} %")
            g["rss"].set(
                _pct(s.process_rss_bytes, s.system_memory_total_bytes),
                f"{_gib(s.process_rss_bytes)} of {_gib(s.system_memory_total_bytes)}",
            )
            g["memory"].set(
                _pct(s.system_memory_used_bytes, s.system_memory_total_bytes),
                f"{_gib(s.system_memory_used_bytes)} / {_gib(s.system_memory_total_bytes)}",
            )

    def history_series(self) -> tuple[list[float], list[float | None], list[float | None]]:
        """(seconds ago, utilization %, memory %) of the kept samples in the chart window."""
        now = time.time()
        xs: list[float] = []
        util: list[float | None] = []
        mem: list[float | None] = []
        for s in self.sampler.history(since=now - HISTORY_SECONDS):
            xs.append(s.time - now)
            if s.source == "nvml" and s.gpus:
                gpu = s.gpus[0]
                util.append(gpu.util_percent)
                mem.append(_pct(gpu.memory_used_bytes, gpu.memory_total_bytes))
            else:
                util.append(s.cpu_util_percent)
                mem.append(_pct(s.system_memory_used_bytes, s.system_memory_total_bytes))
        return xs, util, mem

    def _draw_history(self, source: str) -> None:
        xs, util, mem = self.history_series()
        nan = float("nan")
        self._line_util.set_data(xs, [nan if v is None else v for v in util])
        self._line_mem.set_data(xs, [nan if v is None else v for v in mem])
        self.chart.render()

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        if self.closed:
            return
        self.timer.stop()
        if self._owns_sampler:
            self.sampler.close()
        super().close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "live"
        return f"MonitorPanel(source={getattr(self.sampler, 'source', '?')!r}, {state})"
