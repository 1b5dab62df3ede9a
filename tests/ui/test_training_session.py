"""TrainingPanel over a real Session (a very small built-in GPT on the CPU)."""

from __future__ import annotations

import time

import pytest

from workbench import Session, TrainConfig
from workbench.ui import TrainingPanel

SMALL = dict(layers=2, hidden=64, heads=2, seq_len=32)


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def session():
    s = Session(TrainConfig(micro_batch=4), model="tiny-gpt", model_options=SMALL)
    yield s
    s.close()


def test_live_change_is_applied_and_marked(session: Session, no_leaked_threads) -> None:
    session.run(optimizer_steps=2)
    panel = TrainingPanel(session, autostart=False)
    try:
        panel.controls["grad_accum"].widget.value = "2"  # idle: applied at once
        assert session.config.grad_accum == 2 and "grad_accum=2 applied" in panel.message_text

        panel.buttons["start"].click()
        assert session.state == "running"
        n = len(session.history)
        _wait(lambda: len(session.history) >= n + 2, "two steps after start")
        panel.controls["grad_accum"].widget.value = "3"  # running: queued for the next step
        changed = lambda: [r for r in session.history if r.changes.get("grad_accum") == 3]  # noqa: E731
        _wait(lambda: bool(changed()), "a record carrying the change")
        step = changed()[0].step
        panel.refresh(draw_now=True)
        assert session.config.grad_accum == 3
        assert "grad_accum=3" in panel.status_text
        assert f"last change at step {step}: grad_accum=3" in panel.status_text
        assert float(step) in panel.chart_data()["change_steps"]
        assert step in panel.chart_data()["steps"]

        panel.buttons["stop"].click()
        assert session.state == "stopped"
        panel.buttons["pause"].click()
        assert "pause: only a running session can pause (state: stopped)" in panel.message_text
        assert session.state == "stopped"
    finally:
        panel.close()
        session.close()


def test_bad_input_leaves_the_real_session_unchanged(session: Session) -> None:
    panel = TrainingPanel(session, autostart=False)
    try:
        before = session.config
        panel.controls["micro_batch"].widget.value = "abc"
        panel.controls["grad_accum"].widget.value = "0"
        panel.controls["lr"].widget.value = ""
        panel.controls["offload_optimizer"].widget.value = "cpu"  # needs ZeRO 1-3
        errors = panel.errors()
        assert set(errors) == {"micro_batch", "grad_accum", "lr", "offload_optimizer"}
        assert "offload_optimizer='cpu'" in errors["offload_optimizer"]
        assert panel.controls["offload_optimizer"].widget.value == "none"
        assert session.config == before and session.pending_changes == {}
        panel.buttons["resume"].click()
        assert "resume: only a paused or failed session" in panel.message_text
        assert session.state == "idle"
    finally:
        panel.close()


def test_memory_measured_next_to_prediction(session: Session) -> None:
    session.run(optimizer_steps=1)
    panel = TrainingPanel(session, autostart=False, measure_memory=False)
    try:
        panel.refresh(draw_now=True)
        mem = panel.memory_chart_data()  # from the step record and the estimator
        assert mem["labels"] == ["parameters", "gradients", "optimizer", "peak of a step"]
        assert mem["measured"][0] == session.history[-1].params_bytes
        assert mem["predicted"][0] > 0
        panel.buttons["memory"].click()
        panel.wait_for_tasks()
        assert "memory measured" in panel.message_text, panel.message_text
        panel.refresh(draw_now=True)
        mem = panel.memory_chart_data()
        assert mem["labels"] == [
            *("parameters", "gradients", "optimizer", "activations", "peak of a step")
        ]
        report = panel.memory_report
        assert mem["measured"][3] == pytest.approx(report.activation_bytes)
        assert mem["predicted"][3] == pytest.approx(report.predicted_activation_bytes)
    finally:
        panel.close()


def test_profile_and_save_buttons_on_a_real_session(session: Session, tmp_path) -> None:
    panel = TrainingPanel(session, autostart=False)
    try:
        panel.buttons["profile"].click()  # runs off the kernel's thread
        panel.wait_for_tasks(timeout=300)
        assert panel.message_text.startswith("profile: 3 steps"), panel.message_text
        assert "ms per step" in panel.message_text and "top operators" in panel.profile_html.value
        session.update(checkpoint_dir=str(tmp_path))
        panel.buttons["save"].click()
        assert f"checkpoint saved: {tmp_path}" in panel.message_text
        assert list(tmp_path.glob("*.pt"))
    finally:
        panel.close()


def test_panel_measures_activations_without_a_click(session: Session) -> None:
    session.run(optimizer_steps=1)
    panel = TrainingPanel(session, autostart=False)  # its first refresh sees the record
    try:
        panel.wait_for_tasks(timeout=300)
        panel.refresh(draw_now=True)
        mem = panel.memory_chart_data()
        labels = ["parameters", "gradients", "optimizer", "activations", "peak of a step"]
        assert mem["labels"] == labels
        assert mem["measured"][3] == pytest.approx(panel.memory_report.activation_bytes)
        assert mem["predicted"][4] == pytest.approx(panel.memory_report.predicted.peak_bytes)
        assert mem["measured"][3] > 0 and mem["predicted"][3] > 0
        assert panel.memory_error is None
    finally:
        panel.close()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_the_panels_predicted_bars_are_session_memorys_prediction(stage: int) -> None:
    """One setup, one prediction: the bars the panel draws from the step records and the
    prediction `session.memory()` reports come from the same function."""
    config = TrainConfig(micro_batch=4, zero_stage=stage)
    with Session(config, model="tiny-gpt", model_options=SMALL) as s:
        s.run(optimizer_steps=1)
        panel = TrainingPanel(s, autostart=False, measure_memory=False)
        try:
            panel.refresh(draw_now=True)
            bars = panel.memory_chart_data()
        finally:
            panel.close()
        report = s.memory()
    pred = report.predicted
    assert pred is not None and pred.accounting == ("deepspeed" if stage else "paper")
    assert bars["labels"] == ["parameters", "gradients", "optimizer", "peak of a step"]
    assert bars["predicted"] == pytest.approx(
        [pred.params_bytes, pred.grads_bytes, pred.optimizer_bytes, pred.peak_bytes]
    )
    assert pred.activation_bytes is not None  # the built-in GPT's shape reaches the estimator


def test_the_dry_run_button_simulates_the_session_and_the_chart_shows_it() -> None:
    with Session(TrainConfig(micro_batch=4), model="tiny-gpt", model_options=SMALL) as s:
        s.run(optimizer_steps=1)
        panel = TrainingPanel(s, autostart=False, measure_memory=False)
        try:
            panel.buttons["dryrun"].click()
            panel.wait_for_tasks(timeout=300)
            assert panel.message_text.startswith("dry run: peak of a step"), panel.message_text
            panel.refresh(draw_now=True)
            mem = panel.memory_chart_data()
            run = panel.memory_report.dry_run
            assert run is not None and "peak (dry run)" in mem["labels"]
            at = mem["labels"].index("peak (dry run)")
            assert mem["measured"][at] == pytest.approx(run.peak_bytes)
            assert mem["predicted"][at] == pytest.approx(panel.memory_report.predicted.peak_bytes)
        finally:
            panel.close()


def test_the_memory_technique_advice_applies_in_one_click(session: Session) -> None:
    """The panel lists the technique that frees the most of the predicted peak (here 8-bit
    AdamW: in pure bf16 with the activations offloaded, the small GPT's optimizer states
    outweigh what stays of them; without, offloading frees a little more, and in fp32 pure
    bf16 the most) with its apply button, and one click changes the session."""
    session.update(activation_offload=True, precision="bf16-true")
    session.run(optimizer_steps=2)
    panel = TrainingPanel(session, autostart=False)
    try:
        panel.refresh(draw_now=True)
        advice = next(a for a in panel.advice if a.id == "memory-technique")
        assert advice.apply == session.memory_advice()[0].apply == {"optimizer": "adam8bit"}
        assert advice.message.startswith("optimizer states are") and "frees" in advice.message
        button = next(
            w.children[1]
            for w in panel.advice_box.children
            if len(w.children) == 2
            and "wb-advice-apply-memory-technique" in w.children[1]._dom_classes
        )
        button.click()
        assert session.config.optimizer == "adam8bit"
    finally:
        panel.close()
