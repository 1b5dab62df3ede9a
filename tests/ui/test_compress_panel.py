"""CompressionPanel: measures copies of a live session's model in a background thread and
shows the report; bad settings show a message and nothing runs; the session's model is
never changed."""

from __future__ import annotations

import pytest
import torch

from workbench import Session, TrainConfig
from workbench.ui import CompressionPanel
from workbench.ui.fields import strip_tags

MLP = {"in_features": 16, "hidden": 32, "depth": 2, "out_features": 4, "samples": 256}


@pytest.fixture
def session():
    torch.set_num_threads(1)
    s = Session(TrainConfig(micro_batch=16), model="mlp", model_options=MLP)
    s.run(optimizer_steps=2)
    yield s
    s.close()


def test_measure_shows_the_table_and_chart(session, no_leaked_threads) -> None:
    before = {k: v.clone() for k, v in session.state_dict().items()}
    panel = CompressionPanel(session, repeats=3)
    try:
        assert panel.charts() == [] and panel.selected() == ["int8", "prune", "channels"]
        panel.methods["int8"].value = False
        panel.sparsity.value = 0.25
        report = panel.measure(wait=True)
        assert panel.error is None, panel.error
        assert report is panel.report and report.methods == ("prune", "channels")
        assert report.row("prune").figures.zero_fraction == pytest.approx(0.25, abs=0.01)
        table = strip_tags(panel.table.value)
        # the tail of the session's data, which it may have trained on: "eval", not held-out
        assert "eval loss" in table and "held-out loss" not in table and "channels" in table
        assert report.quality_data == "eval"
        assert panel.chart.png.startswith(b"\x89PNG") and panel.charts() == [panel.chart]
        status = strip_tags(panel.status.value)
        assert status.startswith("measured; pays here:") and "may have trained on" in status
        assert not panel.button.disabled
        assert panel.snapshot_png().startswith(b"\x89PNG")
    finally:
        panel.close()
    assert all(torch.equal(v, before[k]) for k, v in session.state_dict().items())


def test_bad_settings_show_a_message_and_start_nothing(session, no_leaked_threads) -> None:
    panel = CompressionPanel(session)
    try:
        for box in panel.methods.values():
            box.value = False
        assert panel.measure() is None and not panel.running
        assert "name at least one of" in strip_tags(panel.status.value)
        panel.methods["heads"].value = True  # the mlp has no attention heads
        assert panel.measure(wait=True) is None
        assert "heads found nothing it can remove" in strip_tags(panel.status.value)
        assert panel.report is None
    finally:
        panel.close()


def test_a_user_module_needs_its_loss(no_leaked_threads) -> None:
    from workbench.models import build_model

    module, data, loss_fn, _ = build_model("mlp", **MLP)
    with Session(TrainConfig(micro_batch=16), model=module, data=data, loss_fn=loss_fn) as s:
        panel = CompressionPanel(s, repeats=3)
        try:
            panel.measure(wait=True)
            assert "pass CompressionPanel(session, loss_fn=...)" in strip_tags(panel.status.value)
        finally:
            panel.close()
        panel = CompressionPanel(s, loss_fn=loss_fn, repeats=3)
        try:
            assert panel.measure(wait=True) is not None, panel.error
        finally:
            panel.close()


def test_closing_mid_measurement_cancels_it(no_leaked_threads) -> None:
    """close() while the panel measures stops the work at the next model or batch: no
    report, the status says cancelled, and the thread has ended when close returns."""
    from workbench.models import build_model

    module, data, loss_fn, _ = build_model("mlp", **MLP)
    started = __import__("threading").Event()
    panel: CompressionPanel | None = None

    def slow_loss(outputs, targets):
        started.set()
        assert panel is not None
        panel._cancel.wait(timeout=60)  # held here until close() asks the job to stop
        return loss_fn(outputs, targets)

    with Session(TrainConfig(micro_batch=16), model=module, data=data, loss_fn=loss_fn) as s:
        panel = CompressionPanel(s, loss_fn=slow_loss, repeats=3)
        panel.measure()
        assert started.wait(timeout=120) and panel.running
        panel.close()
        assert not panel.running
        assert panel.report is None and panel.error is None
        assert strip_tags(panel.status.value) == "cancelled"


def test_a_bad_quality_tolerance_shows_a_message_and_starts_nothing(
    session, no_leaked_threads
) -> None:
    panel = CompressionPanel(session, max_loss_ratio=0.5, max_accuracy_drop=200)
    try:
        assert panel.measure() is None and not panel.running and panel.report is None
        status = strip_tags(panel.status.value)
        assert "max_loss_ratio=0.5: must be a finite number >= 1" in status
        assert "max_accuracy_drop=200: must be a number of accuracy points in [0, 100]" in status
    finally:
        panel.close()


def test_the_status_names_the_methods_that_lose_quality_and_what_recovers_it() -> None:
    from workbench.compress.report import CompressionReport, Figures, Row
    from workbench.ui.compress import _paying

    def row(method: str, params: int, ms: float, loss: float) -> Row:
        s = ms / 1e3
        figures = Figures(params, params, s, s, s, s, 5, loss, None, 0.0, 100)
        return Row(method, figures)

    report = CompressionReport(
        "m",
        (
            row("before", 4000, 10.0, 0.048),
            row("int8", 1000, 30.0, 0.049),
            row("channels", 1000, 5.0, 0.28),
        ),
        {},
    )
    text = _paying(report)
    assert text.startswith("pays here: int8; smaller or faster but losing quality")
    assert "channels (held-out loss 5.83x the model before's (allowed: 1.05x))" in text
    assert text.endswith("(training the smaller model further can recover it)")
