"""`dashboard()`: the training, estimator, planner, monitor, compression and ladder panels in
tabs."""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from workbench.ui.compress import CompressionPanel
from workbench.ui.estimator import EstimatorPanel
from workbench.ui.ladder import LadderPanel
from workbench.ui.monitor import MonitorPanel
from workbench.ui.panel import PanelBase, TabbedPanels
from workbench.ui.planner import PlannerPanel
from workbench.ui.training import TrainingPanel

TAB_TITLES = (
    "Training",
    "Memory estimator",
    "Planner",
    "Hardware monitor",
    "Compression",
    "Optimization ladder",
)


def training_device(session: Any) -> tuple[str, str | None]:
    """(the device `session` trains on, in words; that GPU's catalog name, or None when it
    is no GPU or one the catalog lacks), for the estimator tab to start at that GPU and to
    say which one it assumes."""
    device = getattr(session, "device", None)
    kind = getattr(device, "type", device)
    if kind in (None, "cpu"):
        return "the CPU", None
    if kind != "cuda":
        return str(device), None
    import torch

    from workbench.estimate.catalog import find_gpu

    name = torch.cuda.get_device_name(device)
    found = find_gpu(name)
    return name, (None if isinstance(found, str) else found.name)


class Dashboard(TabbedPanels):
    """The six panels in tabs. `close()` closes the panels, and the session and sampler
    when the dashboard created them (ones passed in stay open; their owner closes them)."""

    def __init__(self, session: Any | None = None, sampler: Any | None = None) -> None:
        super().__init__()
        self._owned: list[Any] = []
        try:
            if sampler is None:
                from workbench.monitor import Sampler

                sampler = Sampler(interval=0.5)
                self._owned.append(sampler)
            if session is None:
                from workbench.config import TrainConfig
                from workbench.train.session import Session

                session = Session(TrainConfig(), model="tiny-gpt")
                self._owned.insert(0, session)
            self.session = session
            self.sampler = sampler
            self.training = TrainingPanel(session, sampler=sampler)
            device, gpu = training_device(session)
            self.estimator = EstimatorPanel(training_device=device, training_gpu=gpu)
            self.planner = PlannerPanel()
            self.monitor = MonitorPanel(sampler)
            self.compression = CompressionPanel(session)
            self.ladder = LadderPanel(session)
        except BaseException:
            for obj in self._owned:
                obj.close()
            raise
        self.tabs = widgets.Tab(
            children=[
                self.training.widget,
                self.estimator.widget,
                self.planner.widget,
                self.monitor.widget,
                self.compression.widget,
                self.ladder.widget,
            ]
        )
        self.tabs.titles = TAB_TITLES
        self.tabs.add_class("wb-dashboard-tabs")
        self.widget = widgets.VBox([self.tabs])
        self.widget.add_class("wb-dashboard")

    @property
    def panels(self) -> tuple[PanelBase, ...]:
        return (
            self.training,
            self.estimator,
            self.planner,
            self.monitor,
            self.compression,
            self.ladder,
        )

    def __repr__(self) -> str:
        return f"Dashboard({self.training!r}, {self.monitor!r})"


def dashboard(session: Any | None = None, sampler: Any | None = None) -> Dashboard:
    """Training, memory estimator, planner, hardware monitor, compression and the
    optimization ladder in tabs.

    `session=None` creates (and owns) `Session(TrainConfig(), model="tiny-gpt")`;
    `sampler=None` creates (and owns) a `Sampler`. Display the result in a notebook.
    An `Observer` of a run you train yourself (`workbench.integrations`: a Trainer or
    Lightning callback's `observer`, `workbench.observe()`) gets its read-only training
    view with the monitor and the estimator (`workbench.ui.observer.ObserverDashboard`).
    """
    from workbench.integrations.observer import Observer

    if isinstance(session, Observer):
        from workbench.ui.observer import ObserverDashboard

        return ObserverDashboard(session, sampler=sampler)  # type: ignore[return-value]
    return Dashboard(session=session, sampler=sampler)
