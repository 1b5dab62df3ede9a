"""dashboard(): the five panels in tabs, ownership on close, re-run cells close old panels."""

from __future__ import annotations

import time

import pytest
from ui_fakes import FakeSampler, FakeSession, host_sample

import workbench
from workbench.ui import EstimatorPanel, MonitorPanel, TrainingPanel, panel
from workbench.ui import dashboard as ui_dashboard


def test_lazy_exports_from_workbench() -> None:
    assert workbench.dashboard is ui_dashboard
    assert workbench.EstimatorPanel is EstimatorPanel
    assert workbench.TrainingPanel is TrainingPanel
    assert workbench.MonitorPanel is MonitorPanel


def test_tabs_and_ownership(no_leaked_threads) -> None:
    session = FakeSession()
    sampler = FakeSampler([host_sample(time.time())], "host", reason="test")
    d = ui_dashboard(session=session, sampler=sampler)
    try:
        assert d.tabs.titles == (
            "Training",
            "Memory estimator",
            "Planner",
            "Hardware monitor",
            "Compression",
            "Optimization ladder",
        )
        assert d.tabs.children == (
            d.training.widget,
            d.estimator.widget,
            d.planner.widget,
            d.monitor.widget,
            d.compression.widget,
            d.ladder.widget,
        )
        assert d.compression.session is session and d.ladder.session is session
        assert d.training.session is session and d.monitor.sampler is sampler
        bundle = d._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert bundle["image/png"]
    finally:
        d.close()
    assert all(p.closed for p in d.panels)
    # passed-in objects belong to the caller
    assert session.state != "closed" and not sampler.closed


def test_rerunning_a_cell_closes_the_panels_it_made_before(monkeypatch) -> None:
    class Shell:
        pass

    shell = Shell()
    run = {"msg": "run-1"}
    monkeypatch.setattr(panel, "_current_cell", lambda: (shell, "cell-a", run["msg"]))
    first = MonitorPanel(FakeSampler([], "host"), refresh_s=0.25)
    same_run = EstimatorPanel()
    assert first.timer.running
    run["msg"] = "run-2"  # the same cell executed again
    second = MonitorPanel(FakeSampler([], "host"), refresh_s=0.25)
    try:
        assert first.closed and not first.timer.running and same_run.closed
        assert not second.closed and second.timer.running
    finally:
        second.close()


@pytest.mark.parametrize("other_cell", ["cell-b", None])
def test_other_cells_are_left_alone(monkeypatch, other_cell) -> None:
    shell = type("Shell", (), {})()
    cells = iter([(shell, "cell-a", "m1"), (shell, other_cell, "m2")])
    monkeypatch.setattr(panel, "_current_cell", lambda: next(cells))
    first = MonitorPanel(FakeSampler([], "host"), autostart=False)
    second = MonitorPanel(FakeSampler([], "host"), autostart=False)
    assert not first.closed and not second.closed
    first.close()
    second.close()


def test_default_dashboard_owns_its_session_and_sampler(no_leaked_threads) -> None:
    d = ui_dashboard()
    try:
        assert d.session.config.micro_batch >= 1 and d.session.model_name == "tiny-gpt"
        assert d.training.session is d.session and d.monitor.sampler is d.sampler
    finally:
        d.close()
    assert d.session.state == "closed" and d.sampler.closed


def test_snapshot_is_a_png_of_the_current_charts() -> None:
    p = EstimatorPanel()
    try:
        img = p.snapshot()
        assert img.format == "png" and img.data == p.chart.png
        p.fields["micro_batch"].widget.value = "3"
        assert p.snapshot().data == p.chart.png != img.data
    finally:
        p.close()
