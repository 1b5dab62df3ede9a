"""TrainingPanel driven headless over a step-by-step FakeSession (no threads): controls,
buttons, charts, advice and bad input."""

from __future__ import annotations

import pytest
from ui_fakes import FakeSession, report

from workbench.config import TrainConfig
from workbench.ui import TrainingPanel


@pytest.fixture
def session() -> FakeSession:
    return FakeSession()


@pytest.fixture
def panel(session: FakeSession):
    p = TrainingPanel(session, autostart=False)
    yield p
    p.close()


def _set(panel: TrainingPanel, name: str, value) -> None:
    panel.controls[name].widget.value = value


def test_control_change_reaches_the_session_and_the_charts(
    panel: TrainingPanel, session: FakeSession
) -> None:
    session.step()
    _set(panel, "grad_accum", "8")
    assert session.updates == [{"grad_accum": 8}]
    assert "grad_accum=8 queued" in panel.message_text
    session.step()  # the change takes effect at this step
    session.step()
    panel.refresh(draw_now=True)
    assert session.config.grad_accum == 8
    assert "grad_accum=8" in panel.status_text
    data = panel.chart_data()
    assert data["steps"] == [1.0, 2.0, 3.0]
    assert data["change_steps"] == [2.0]
    assert panel.change_steps == [(2, "grad_accum=8")]


def test_every_control_maps_to_its_setting(panel: TrainingPanel, session: FakeSession) -> None:
    _set(panel, "precision", "amp-bf16")
    _set(panel, "micro_batch", "4")
    _set(panel, "clip_grad_norm", "1.0")
    _set(panel, "activation_checkpointing", "selective")
    _set(panel, "num_workers", "2")
    _set(panel, "lr", "1e-3")
    _set(panel, "lr_schedule", "cosine")
    _set(panel, "zero_stage", 1)
    _set(panel, "offload_optimizer", "cpu")
    assert session.updates == [
        {"precision": "amp-bf16"},
        {"micro_batch": 4},
        {"clip_grad_norm": 1.0},
        {"activation_checkpointing": "selective"},
        {"num_workers": 2},
        {"lr": 1e-3},
        {"lr_schedule": "cosine"},
        {"zero_stage": 1},
        {"offload_optimizer": "cpu"},
    ]
    assert panel.errors() == {}
    session.step()
    _set(panel, "clip_grad_norm", "")  # empty clears clipping
    assert session.updates[-1] == {"clip_grad_norm": None}


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("grad_accum", "abc", "accumulation: 'abc' is not a whole number from 1"),
        ("grad_accum", "", "accumulation: empty"),
        ("grad_accum", "0", "accumulation: 0 is out of range"),
        ("micro_batch", "-3", "micro-batch: -3 is out of range"),
        ("micro_batch", "2.5", "micro-batch: '2.5' is not a whole number"),
        ("num_workers", "-1", "loader workers: -1 is out of range"),
        ("lr", "fast", "learning rate: 'fast' is not a number > 0"),
        ("lr", "0", "learning rate: 0 is out of range"),
        ("lr", "inf", "learning rate: inf is out of range"),
        ("clip_grad_norm", "-1", "clip grad norm: -1 is out of range"),
    ],
)
def test_bad_input_message_and_session_unchanged(
    panel: TrainingPanel, session: FakeSession, name: str, value: str, expected: str
) -> None:
    config = session.config
    _set(panel, name, value)
    assert panel.errors()[name].startswith(expected)
    assert expected in panel.message_text
    assert session.updates == [] and session.config is config


def test_session_rejection_is_shown_and_choice_reverts(
    panel: TrainingPanel, session: FakeSession
) -> None:
    _set(panel, "offload_optimizer", "cpu")  # needs ZeRO stage 1-3; the session says so
    err = panel.errors()["offload_optimizer"]
    assert "offload_optimizer='cpu'" in err and "zero_stage" in err
    assert panel.controls["offload_optimizer"].widget.value == "none"
    assert session.updates == [] and str(session.config.offload_optimizer) == "none"
    _set(panel, "offload_params", "cpu")
    assert "zero_stage=3" in panel.errors()["offload_params"]


def test_fixing_a_field_clears_its_error(panel: TrainingPanel, session: FakeSession) -> None:
    _set(panel, "grad_accum", "x")
    assert "grad_accum" in panel.errors()
    _set(panel, "grad_accum", "4")
    assert "grad_accum" not in panel.errors() and session.updates == [{"grad_accum": 4}]


def test_buttons_and_wrong_states(panel: TrainingPanel, session: FakeSession) -> None:
    b = panel.buttons
    b["pause"].click()
    assert session.state == "idle" and "pause: only a running session" in panel.message_text
    b["stop"].click()
    assert session.state == "idle" and "stop: nothing to stop" in panel.message_text
    b["save"].click()  # no checkpoint_dir in the config: under ./checkpoints/<run id>
    assert session.checkpoints == [f"checkpoints/{session.run_id}"]
    assert "checkpoint saved" in panel.message_text
    b["start"].click()
    assert session.state == "running"
    b["start"].click()
    assert session.state == "running" and "start: already started" in panel.message_text
    b["resume"].click()
    assert "resume: only a paused or failed session" in panel.message_text
    b["pause"].click()
    assert session.state == "paused"
    b["resume"].click()
    assert session.state == "running"
    b["stop"].click()
    assert session.state == "stopped"
    panel.refresh(draw_now=True)
    assert panel.status_text.startswith("stopped")


def test_session_exceptions_become_messages(panel: TrainingPanel, session: FakeSession) -> None:
    def broken(**_kw):
        raise RuntimeError("engine rebuild failed")

    session.update = broken  # type: ignore[method-assign]
    _set(panel, "micro_batch", "16")
    assert "micro-batch: engine rebuild failed" in panel.message_text

    def no_ckpt(path=None):
        raise ValueError("checkpoint_dir is not set")

    session.save_checkpoint = no_ckpt  # type: ignore[method-assign]
    panel.buttons["save"].click()
    assert "save: checkpoint_dir is not set" in panel.message_text


def test_a_refusal_of_several_problems_reads_as_one_line(
    panel: TrainingPanel, session: FakeSession
) -> None:
    from workbench.config import ConfigError, SettingProblem

    def refused(**_kw):
        raise ConfigError(
            [
                SettingProblem("offload_optimizer", "cpu", "needs zero_stage 1, 2 or 3"),
                SettingProblem("micro_batch", 16, "too large for this device"),
            ]
        )

    session.update = refused  # type: ignore[method-assign]
    _set(panel, "micro_batch", "16")
    assert "not applied: 2 invalid settings: offload_optimizer='cpu': needs zero_stage 1, 2 " in (
        panel.message_text
    )
    assert "; micro_batch=16: too large for this device" in panel.message_text
    assert ":;" not in panel.message_text


def test_profile_runs_off_the_kernel_thread(panel: TrainingPanel) -> None:
    panel.buttons["profile"].click()
    panel.wait_for_tasks()
    assert "profile: profiled 3 steps" in panel.message_text


def test_charts_follow_records(panel: TrainingPanel, session: FakeSession) -> None:
    for i in range(5):
        session.step(loss=2.0 - 0.1 * i, data_seconds=0.02, compute_seconds=0.08)
    panel.refresh(draw_now=True)
    panel.wait_for_tasks()  # the automatic memory measurement the first records start
    panel.refresh(draw_now=True)
    data = panel.chart_data()
    assert data["loss"] == pytest.approx([2.0, 1.9, 1.8, 1.7, 1.6])
    assert data["data_seconds"] == pytest.approx([0.02] * 5)
    assert data["step_seconds"] == pytest.approx([0.1] * 5)
    assert data["samples_per_s"] == pytest.approx([80.0] * 5)
    mem = panel.memory_chart_data()  # the automatic measurement: states and activations
    # the peak of a step: predicted (model states + foreach AdamW's 4-byte temporary);
    # measured only on CUDA (the step's max_memory_allocated)
    assert mem["labels"] == [
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "peak of a step",
    ]
    assert mem["measured"] == pytest.approx([4000, 4000, 8000, 2048, 0])
    assert mem["predicted"] == pytest.approx([4000, 4000, 8000, 0, 20000])
    renders = panel.chart.renders
    panel.refresh(draw_now=True)  # nothing new: no redraw
    assert panel.chart.renders == renders


def test_measure_memory_button_draws_measured_vs_predicted(
    panel: TrainingPanel, session: FakeSession
) -> None:
    session.step()
    measured = report(session, activation_bytes=5 << 20, params_bytes=3 << 20)
    session.memory = lambda: measured  # type: ignore[method-assign]
    panel.buttons["memory"].click()
    panel.wait_for_tasks()
    pred = measured.predicted
    assert f"memory measured: parameters 3.0 MiB (predicted {pred.params_bytes / 2**20:.1f}" in (
        panel.message_text
    )
    panel.refresh(draw_now=True)
    mem = panel.memory_chart_data()
    assert mem["labels"] == [
        "parameters",
        "gradients",
        "optimizer",
        "activations",
        "peak of a step",
    ]
    assert mem["measured"] == pytest.approx([3 << 20, 4000, 8000, 5 << 20, 0])
    assert mem["predicted"] == pytest.approx(
        [pred.params_bytes, pred.grads_bytes, pred.optimizer_bytes, 0, pred.peak_bytes]
    )  # the fake model has no shape: no activation prediction


def test_settings_changed_elsewhere_show_in_the_controls(
    panel: TrainingPanel, session: FakeSession
) -> None:
    session.update(micro_batch=32)
    session.step()
    panel.refresh(draw_now=True)
    assert panel.controls["micro_batch"].widget.value == "32"
    assert session.updates == [{"micro_batch": 32}]  # showing it did not send it back


def test_advice_apply_button_updates_the_session(
    panel: TrainingPanel, session: FakeSession
) -> None:
    for _ in range(8):  # the loop waits for data most of each step
        session.step(data_seconds=0.08, compute_seconds=0.02)
    panel.refresh(draw_now=True)
    ids = [a.id for a in panel.advice]
    assert "data-loader-stall" in ids
    advice = next(a for a in panel.advice if a.id == "data-loader-stall")
    button = next(
        w.children[1]
        for w in panel.advice_box.children
        if len(w.children) == 2
        and "wb-advice-apply-data-loader-stall" in w.children[1]._dom_classes
    )
    button.click()
    assert session.updates[-1] == advice.apply
    assert "applied advice" in panel.message_text
    assert panel.apply_advice("no-such-advice") is False


def test_rejects_non_session_and_fast_refresh() -> None:
    with pytest.raises(ValueError, match="must be a workbench.Session"):
        TrainingPanel(object())
    with pytest.raises(ValueError, match="interval_s=0.1"):
        TrainingPanel(FakeSession(TrainConfig()), refresh_s=0.1)


def test_timer_refreshes_and_close_stops_it(session: FakeSession, no_leaked_threads) -> None:
    import time

    p = TrainingPanel(session, refresh_s=0.25)
    try:
        session.step()
        deadline = time.monotonic() + 10
        while not p.records and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(p.records) == 1 and p.timer.running
    finally:
        p.close()
    assert not p.timer.running and p.closed
    bundle = p._repr_mimebundle_()  # closed: no widget view, the PNG remains
    assert "application/vnd.jupyter.widget-view+json" not in bundle and bundle["image/png"]


def test_redraws_are_spaced_to_a_small_share_of_time(
    panel: TrainingPanel, session: FakeSession
) -> None:
    session.step()
    panel.refresh(draw_now=True)
    renders = panel.chart.renders
    session.step()
    panel.refresh()  # right after a draw: the redraw waits for its budget
    assert panel.chart.renders == renders and panel.chart_data()["steps"] == [1.0]
    assert "step 2" in panel.status_text  # text still follows every tick
    panel._next_draw = 0.0  # the budget has passed
    panel.refresh()
    assert panel.chart.renders == renders + 1 and panel.chart_data()["steps"] == [1.0, 2.0]


def test_error_state_shows_the_sessions_message(panel: TrainingPanel, session: FakeSession) -> None:
    from workbench.train.records import Event

    session.state = "error"
    session.failure = "step 3 failed: RuntimeError: boom"
    session.events.append(Event("error", session.failure, 3, "error"))
    panel.refresh(draw_now=True)
    assert panel.status_text.startswith("error")
    assert "step 3 failed: RuntimeError: boom" in panel.status_text
    assert "boom" in strip(panel.events_html.value)


def test_a_nan_pause_shows_why_in_the_status_line(
    panel: TrainingPanel, session: FakeSession
) -> None:
    session.state = "paused"
    session.failure = "loss is nan at step 4: the step was not applied and the session paused"
    panel.refresh(draw_now=True)
    assert panel.status_text.startswith("paused")
    assert "loss is nan at step 4" in panel.status_text
    session.failure = None  # a new run clears it
    panel.refresh(draw_now=True)
    assert "loss is nan" not in panel.status_text


def strip(html_text: str) -> str:
    from workbench.ui.fields import strip_tags

    return strip_tags(html_text)


def test_first_records_measure_memory_with_activations_quietly(session: FakeSession) -> None:
    calls: list[int] = []

    def memory():
        calls.append(len(session.history))
        return report(session, activation_bytes=9000)

    session.memory = memory  # type: ignore[method-assign]
    panel = TrainingPanel(session, autostart=False)
    try:
        panel.refresh(draw_now=True)
        panel.wait_for_tasks()
        assert calls == []  # no step yet: optimizer states do not exist to measure
        session.step()
        _set(panel, "grad_accum", "4")
        panel.refresh(draw_now=True)
        panel.wait_for_tasks()
        panel.refresh(draw_now=True)
        assert calls == [1]
        mem = panel.memory_chart_data()
        assert mem["labels"] == [
            "parameters",
            "gradients",
            "optimizer",
            "activations",
            "peak of a step",
        ]
        assert mem["measured"] == pytest.approx([4000, 4000, 8000, 9000, 0])
        # no activation formula; the peak with 4 micro-batches: every gradient held
        assert mem["predicted"][:4] == pytest.approx([4000, 4000, 8000, 0])
        assert mem["predicted"][4] == pytest.approx(20000)
        assert "grad_accum=4 queued" in panel.message_text  # the user's feedback stays
        session.step()
        panel.refresh(draw_now=True)
        panel.wait_for_tasks()
        assert calls == [1, 2]  # grad_accum moves the peak (`Setting.moves_memory`): again
    finally:
        panel.close()


def test_automatic_memory_measurement_can_be_turned_off(session: FakeSession) -> None:
    calls: list[int] = []
    session.memory = lambda: calls.append(1)  # type: ignore[method-assign]
    panel = TrainingPanel(session, autostart=False, measure_memory=False)
    try:
        session.step()
        panel.refresh(draw_now=True)
        panel.wait_for_tasks()
        assert calls == [] and panel.memory_chart_data()["labels"] == [
            "parameters",
            "gradients",
            "optimizer",
            "peak of a step",
        ]
    finally:
        panel.close()


def test_memory_legend_does_not_cover_the_bars(panel: TrainingPanel, session: FakeSession) -> None:
    session.step()
    panel.refresh(draw_now=True)
    panel.wait_for_tasks()
    panel.refresh(draw_now=True)
    ax = panel._ax_mem
    renderer = panel.chart.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for b in panel._mem_bars for p in b.patches]
    assert bars and not any(legend.overlaps(b) for b in bars)


def test_fsdp_sits_next_to_the_zero_stage(panel: TrainingPanel, session: FakeSession) -> None:
    assert panel.controls["fsdp"].widget.options == (
        "off",
        "full_shard",
        "shard_grad_op",
        "no_shard",
    )
    _set(panel, "fsdp", "full_shard")
    assert session.updates[-1] == {"fsdp": "full_shard"}
    session.step()
    _set(panel, "zero_stage", 2)  # both engines at once: refused, naming both
    err = panel.errors()["zero_stage"]
    assert "fsdp='full_shard'" in err and "zero_stage=2" in err
    assert session.config.zero_stage == 0 and session.config.fsdp == "full_shard"


def test_the_controls_are_the_settings_declared_for_the_panel() -> None:
    from workbench.config import SETTINGS
    from workbench.ui.training import CONTROLS

    panel = sorted((s.panel, n) for n, s in SETTINGS.items() if s.panel is not None)
    assert [c.name for c in CONTROLS] == [n for _, n in panel]
    for c in CONTROLS:
        spec = SETTINGS[c.name]
        assert c.label == spec.label
        if c.kind in ("int", "float", "optional-float"):
            assert c.maximum == spec.maximum
    zero = next(c for c in CONTROLS if c.name == "zero_stage")
    assert zero.kind == "choice" and zero.options == (0, 1, 2, 3)
