"""LadderPanel: runs a ladder in a background thread with a progress bar and shows its table
and chart; bad fields or rungs show a message and nothing runs; cancel stops it; a session
gives the model and its basic settings, never its optimizations."""

from __future__ import annotations

import threading

import pytest
from ui_fakes import FakeSession

from workbench import TrainConfig
from workbench.train.ladder import run as ladder_run
from workbench.ui import LadderPanel
from workbench.ui.fields import strip_tags
from workbench.ui.ladder import base_of

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 256}
RUNGS = [{"name": "baseline"}, {"name": "+ accumulation", "grad_accum": 2}]


def test_run_shows_progress_table_and_chart(no_leaked_threads) -> None:
    panel = LadderPanel(model="mlp", model_options=MLP, rungs=RUNGS, steps=4, device="cpu")
    try:
        assert panel.charts() == [] and panel.compile.disabled  # a custom ladder
        panel.target.widget.value = "100"
        result = panel.run(wait=True)
        assert panel.error is None, panel.error
        assert result is panel.result and result.names == ("baseline", "+ accumulation")
        assert panel.progress.value == panel.progress.max == 4 + 2
        assert "6/6 steps" in panel.progress_label.value
        table = strip_tags(panel.table.value)
        assert "+ accumulation" in table and "to loss 100" in table
        assert panel.chart.png.startswith(b"\x89PNG") and panel.charts() == [panel.chart]
        assert strip_tags(panel.status.value).startswith("done; helped here:")
        assert not panel.button.disabled and panel.cancel_button.disabled
        assert panel.snapshot_png().startswith(b"\x89PNG")
    finally:
        panel.close()


def test_bad_fields_and_rungs_show_a_message_and_run_nothing(monkeypatch) -> None:
    monkeypatch.setattr(ladder_run, "run_plan", lambda *a, **k: pytest.fail("it ran"))
    panel = LadderPanel(model="mlp", model_options=MLP, rungs=RUNGS, device="cpu")
    try:
        panel.steps.widget.value = "zero"
        panel.target.widget.value = "low"
        assert panel.run() is None and not panel.running
        assert "baseline steps: 'zero' is not a whole number" in panel.steps.error_text
        assert "target loss: 'low' is not a number" in panel.target.error_text
        assert panel.error == "check the fields marked in red"
        panel.steps.widget.value = "3"  # 24 samples: the accumulation rung's 16 do not divide
        panel.target.widget.value = ""
        assert panel.run() is None and panel.steps.error_text == ""
        assert "effective batch 16 must divide" in strip_tags(panel.status.value)
    finally:
        panel.close()


def test_cancel_stops_the_run(no_leaked_threads) -> None:
    panel = LadderPanel(model="mlp", model_options=MLP, rungs=RUNGS, steps=64, device="cpu")
    started = threading.Event()
    show = panel._on_progress

    def on_progress(p) -> None:
        show(p)
        if p.done >= 2:
            started.set()

    panel._on_progress = on_progress  # type: ignore[method-assign]
    try:
        panel.run()
        assert started.wait(60)
        panel.cancel()
        panel._thread.join(60)
        assert panel.error == "cancelled" and panel.result is None
        assert strip_tags(panel.status.value).startswith("cancelled")
        assert panel.progress.value < panel.progress.max
    finally:
        panel.close()


def test_a_session_gives_its_model_and_basic_settings_only() -> None:
    config = TrainConfig(micro_batch=4, lr=1e-2, seed=5, precision="amp-bf16", grad_accum=2)
    base = base_of(config)
    assert (base.micro_batch, base.lr, base.seed) == (4, 1e-2, 5)
    assert (base.precision, base.grad_accum) == ("fp32", 1)  # the rungs add optimizations
    session = FakeSession(config)  # a session training its own module: no model name
    panel = LadderPanel(session)
    try:
        assert panel.run() is None
        assert "the session trains your own module" in strip_tags(panel.status.value)
    finally:
        panel.close()


def test_the_memory_ladder_runs_from_the_tab() -> None:
    """(No thread-leak check here: the 8-bit AdamW rung's torch.compile keeps inductor's
    own worker threads for the process, by design.)"""
    tiny = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 16, "dropout": 0.0}
    panel = LadderPanel(model="tiny-gpt", model_options=tiny, steps=2, device="cpu")
    try:
        panel.repeats.widget.value = "1"
        panel.kind.value = "memory"
        panel.compile.value = True  # the speed ladder's option: not the memory ladder's
        result = panel.run(wait=True)
        assert panel.error is None, panel.error
        assert result.setup["kind"] == "memory" and len(result.names) == 6
        assert "memory frees" in str(result) and "+ 8-bit AdamW" in strip_tags(panel.table.value)
    finally:
        panel.close()
