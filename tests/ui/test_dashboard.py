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


def _setup_axis_label(d) -> str:
    return d.estimator.chart.figure.axes[0].get_xlabel()


def test_for_a_cpu_session_the_estimator_says_which_gpu_it_assumes(no_leaked_threads) -> None:
    sampler = FakeSampler([host_sample(time.time())], "host", reason="test")
    d = ui_dashboard(session=FakeSession(), sampler=sampler)  # no device: the CPU
    try:
        assert d.estimator.fields["gpu"].widget.value == "a100-80gb"
        text = "a100-80gb assumed; this session trains on the CPU"
        assert d.estimator.assumed_gpu_text() == text and _setup_axis_label(d) == text
    finally:
        d.close()
    alone = EstimatorPanel()  # a panel on its own says nothing of a session
    try:
        assert alone.assumed_gpu_text() == "" and alone.chart.figure.axes[0].get_xlabel() == ""
    finally:
        alone.close()


@pytest.mark.parametrize(
    ("reported", "gpu"),
    [("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H100 PCIe", None)],
)
def test_a_session_on_a_gpu_starts_the_estimator_at_it_when_the_catalog_has_it(
    monkeypatch, no_leaked_threads, reported, gpu
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: reported)
    session = FakeSession()
    session.device = torch.device("cuda", 0)
    sampler = FakeSampler([host_sample(time.time())], "host", reason="test")
    d = ui_dashboard(session=session, sampler=sampler)
    try:
        field = d.estimator.fields["gpu"].widget
        if gpu is None:  # a board the catalog lacks: the default, said to be assumed
            assert field.value == "a100-80gb"
            assert _setup_axis_label(d) == f"a100-80gb assumed; this session trains on {reported}"
        else:
            assert field.value == gpu
            assert _setup_axis_label(d) == f"{gpu}: the GPU this session trains on"
            field.value = "a100-80gb"  # another GPU chosen: said to be assumed
            assert _setup_axis_label(d) == f"a100-80gb assumed; this session trains on {reported}"
    finally:
        d.close()


def test_the_estimators_training_device_is_checked() -> None:
    with pytest.raises(
        ValueError, match="training_gpu=.h100.: must be None or one of v100-16gb, .*h100-80gb"
    ):
        EstimatorPanel(training_gpu="h100")
    with pytest.raises(ValueError, match="training_device=3: must be a device's name or None"):
        EstimatorPanel(training_device=3)
