"""EstimatorPanel driven headless: set field values and check estimate, chart and errors."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from workbench.estimate import GIB, compare_engines, estimate_memory
from workbench.ui import EstimatorPanel
from workbench.ui.estimator import SEGMENTS, segment_bytes


@pytest.fixture
def panel():
    p = EstimatorPanel()
    yield p
    p.close()


def _set(panel: EstimatorPanel, name: str, value) -> None:
    panel.fields[name].widget.value = value


def test_default_chart_matches_the_estimator(panel: EstimatorPanel) -> None:
    e = panel.estimate
    assert e is not None and panel.errors() == {}
    expected = estimate_memory(
        layers=32,
        hidden=4096,
        heads=32,
        seq_len=2048,
        vocab=32000,
        micro_batch=1,
        precision="amp-bf16",
        optimizer="adamw",
        zero_stage=2,
        gpus=8,
        checkpointing="selective",
        gpu="a100-80gb",
        tokens=140e9,
        price_per_gpu_hour=2.0,
    )
    assert e == expected
    data = panel.chart_data()
    # the bar is the peak of a step: its terms, then the CUDA context and reserve
    terms = expected.peak_terms
    assert data["parameters"][0] == pytest.approx(terms["parameters"] / GIB)
    assert data["activations"][0] == pytest.approx(terms["activations"] / GIB)
    assert data["reserve"][0] == pytest.approx(expected.overhead_bytes / GIB)
    assert sum(v[0] for v in data.values()) == pytest.approx(expected.required_bytes / GIB)
    assert set(data) == {name for name, *_ in SEGMENTS}
    stages = compare_engines(
        layers=32,
        hidden=4096,
        heads=32,
        seq_len=2048,
        vocab=32000,
        micro_batch=1,
        precision="amp-bf16",
        optimizer="adamw",
        gpus=8,
        checkpointing="selective",
        gpu="a100-80gb",
        tokens=140e9,
        price_per_gpu_hour=2.0,
    )
    assert data["optimizer states"][1:] == pytest.approx(
        [s.peak_terms["optimizer states"] / GIB for s in stages]
    )
    for col, s in enumerate(stages, start=1):  # every column stacks its own peak
        assert sum(v[col] for v in data.values()) == pytest.approx(s.required_bytes / GIB)
    assert [s.zero_stage for s in stages] == [0, 1, 2, 3, 0] and stages[-1].fsdp == "full_shard"
    # at rest FSDP full_shard holds what ZeRO-3 does: everything sharded over the 8 GPUs
    assert stages[-1].model_states_bytes == stages[3].model_states_bytes
    assert panel.gpu_line_value() == pytest.approx(79.14)  # an A100 80GB as PyTorch sees it
    assert panel.chart.png.startswith(b"\x89PNG")
    summary = panel.summary.value
    assert "fits" in summary and "max micro-batch" in summary and "cost" in summary
    assert "peak of a step" in summary and "model states at rest" in summary


def test_change_recomputes_and_redraws_in_place(panel: EstimatorPanel) -> None:
    figure, image, axes = panel.chart.figure, panel.chart.image, list(panel.chart.figure.axes)
    before_act = panel.chart_data()["activations"][0]
    before_png, renders = panel.chart.png, panel.chart.renders
    _set(panel, "micro_batch", "4")
    assert panel.estimate.micro_batch == 4
    # 4x the activations; the peak's moment may move within backward (micro-batch 1: the
    # last layer's, beside ZeRO-2's flattened reduce copy; 4: the loss's), whose
    # activations differ by selective recomputation's working set (30 parts per million)
    assert panel.chart_data()["activations"][0] == pytest.approx(4 * before_act, rel=1e-4)
    assert panel.chart.renders == renders + 1 and panel.chart.png != before_png
    assert panel.chart.image.value == panel.chart.png
    # the same figure, axes and image widget: no new figure per change, nothing in pyplot
    assert panel.chart.figure is figure and panel.chart.image is image
    assert list(panel.chart.figure.axes) == axes
    assert plt.get_fignums() == []


def test_stage_and_gpu_type_and_units(panel: EstimatorPanel) -> None:
    _set(panel, "zero_stage", 3)
    assert panel.estimate.zero_stage == 3
    assert panel.chart_data()["parameters"][0] == pytest.approx(panel.stages[3].params_bytes / GIB)
    _set(panel, "gpu", "h200-141gb")
    assert panel.gpu_line_value() == pytest.approx(139.81)  # an H200 as PyTorch sees it
    gib_total = sum(v[0] for v in panel.chart_data().values())
    panel.units.value = "GB"
    gb_total = sum(v[0] for v in panel.chart_data().values())
    assert gb_total == pytest.approx(gib_total * GIB / 1e9)
    assert "GB" in panel.summary.value and "GiB" not in panel.summary.value


def test_parameter_count_mode_175b(panel: EstimatorPanel) -> None:
    panel.mode.value = "parameter count"
    _set(panel, "n_params", "175B")
    _set(panel, "precision", "fp16")
    _set(panel, "optimizer", "adam")
    _set(panel, "zero_stage", 0)
    _set(panel, "gpus", "1")
    e = panel.estimate
    assert e.n_params == 175_000_000_000
    assert e.total_bytes == 16 * 175_000_000_000  # 2.8 TB of model states
    assert e.activation_bytes is None and e.fits is False
    assert panel.chart_data()["activations"][0] == 0
    assert "does not fit" in panel.summary.value


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("micro_batch", "abc", "micro-batch: 'abc' is not a whole number >= 1"),
        ("micro_batch", "", "micro-batch: empty"),
        ("micro_batch", "0", "micro-batch: 0 is out of range"),
        ("gpus", "-2", "GPUs: -2 is out of range"),
        ("gpus", "2.5", "GPUs: '2.5' is not a whole number"),
        ("layers", "many", "layers: 'many' is not a whole number"),
        ("mfu", "1.5", "MFU: 1.5 is out of range"),
        ("mfu", "0", "MFU: 0 is out of range"),
        ("overhead_gib", "nan", "CUDA reserve (GiB): nan is out of range"),
        ("grad_accum", "0", "accumulation: 0 is out of range"),
        ("loss_chunks", "x", "loss chunks: 'x' is not a whole number"),
        ("tokens", "lots", "training tokens: 'lots' is not a count"),
        ("price_per_gpu_hour", "-1", "$ per GPU-hour: -1 is out of range"),
    ],
)
def test_bad_text_shows_error_beside_field_and_keeps_chart(
    panel: EstimatorPanel, name: str, value: str, expected: str
) -> None:
    estimate, png, data = panel.estimate, panel.chart.png, panel.chart_data()
    _set(panel, name, value)
    errors = panel.errors()
    assert list(errors) == [name]
    assert errors[name].startswith(expected)
    assert panel.fields[name].error.value  # rendered next to the field
    assert panel.estimate is estimate and panel.chart.png == png and panel.chart_data() == data
    assert "last valid" in panel.status.value


def test_estimator_rejections_land_beside_the_right_field(panel: EstimatorPanel) -> None:
    _set(panel, "offload_params", True)  # needs ZeRO 3; default stage is 2
    errors = panel.errors()
    assert list(errors) == ["offload_params"]
    assert "offload parameters" in errors["offload_params"] and "3" in errors["offload_params"]
    _set(panel, "zero_stage", 3)
    assert panel.errors() == {} and panel.estimate.offload_params is True
    assert panel.chart_data()["parameters"][0] == 0  # parameters live on the CPU
    _set(panel, "heads", "33")
    assert "must divide" in panel.errors()["heads"]


def test_fixing_input_clears_error(panel: EstimatorPanel) -> None:
    _set(panel, "micro_batch", "x")
    assert "micro_batch" in panel.errors()
    _set(panel, "micro_batch", "2")
    assert panel.errors() == {} and panel.estimate.micro_batch == 2
    assert panel.status.value == ""


def test_empty_tokens_means_no_time(panel: EstimatorPanel) -> None:
    _set(panel, "tokens", "")
    assert panel.errors() == {}
    assert panel.estimate.train_seconds is None and "cost" not in panel.summary.value


def test_constructor_rejects_unknown_inputs() -> None:
    with pytest.raises(ValueError, match="bogus=1: unknown input"):
        EstimatorPanel(bogus=1)
    with pytest.raises(ValueError, match="units='MB'"):
        EstimatorPanel(units="MB")


def test_set_values_fills_the_fields_with_one_recompute_and_refuses_unknown_names() -> None:
    p = EstimatorPanel()
    try:
        before = p.recomputes
        assert p.set_values({"mode": "parameter count", "n_params": 1.3e9, "gpus": 2})
        assert p.recomputes == before + 1
        assert p.estimate.n_params == 1_300_000_000 and p.estimate.gpus == 2
        kept = p.estimate
        with pytest.raises(ValueError, match="bogus=1: unknown input"):
            p.set_values({"gpus": 4, "bogus": 1})
        with pytest.raises(ValueError, match="mode='counted'"):
            p.set_values({"mode": "counted"})
        assert p.estimate is kept and p.fields["gpus"].widget.value == "2"  # nothing changed
    finally:
        p.close()


def test_initial_values_and_static_png() -> None:
    p = EstimatorPanel(mode="parameter count", n_params=1.3e9, gpus=2, zero_stage=1)
    try:
        assert p.estimate.n_params == 1_300_000_000 and p.estimate.gpus == 2
        bundle = p._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert bundle["image/png"]
    finally:
        p.close()


# ------------------------------------------------------------------ presets and parallelism
def test_preset_fills_the_shape_fields(panel: EstimatorPanel) -> None:
    recomputes = panel.recomputes
    _set(panel, "model", "llama-3-8b")
    assert panel.recomputes == recomputes + 1  # one recompute for all the filled fields
    values = {n: panel.fields[n].value for n in ("layers", "hidden", "heads", "kv_heads")}
    assert values == {"layers": "32", "hidden": "4096", "heads": "32", "kv_heads": "8"}
    assert (panel.fields["ffn_hidden"].value, panel.fields["mlp"].value) == ("14336", "swiglu")
    assert panel.fields["tied_embeddings"].value is False
    e = panel.estimate
    assert e.model == "llama-3-8b" and e.n_params == 8_030_261_248
    assert e == estimate_memory(
        model="llama-3-8b",
        micro_batch=1,
        precision="amp-bf16",
        optimizer="adamw",
        zero_stage=2,
        gpus=8,
        checkpointing="selective",
        gpu="a100-80gb",
        tokens=140e9,
        price_per_gpu_hour=2.0,
    )
    assert "llama-3-8b" in panel.summary.value
    # a field changed after the preset overrides it
    _set(panel, "seq_len", "16384")
    assert panel.estimate.seq_len == 16384 and panel.estimate.n_params == 8_030_261_248


def test_preset_from_parameter_mode_switches_to_the_shape(panel: EstimatorPanel) -> None:
    panel.mode.value = "parameter count"
    _set(panel, "model", "gpt2")
    assert panel.mode.value == "transformer shape" and panel.estimate.n_params == 124_439_808
    _set(panel, "seq_len", "2048")  # beyond GPT-2's learned position table
    assert "must not exceed the learned position table" in panel.errors()["seq_len"]


def test_kv_heads_and_ffn_change_the_count(panel: EstimatorPanel) -> None:
    base = panel.estimate.n_params
    _set(panel, "kv_heads", "8")
    # K and V projections shrink from 4096 x 4096 to 4096 x 1024 (+ biases) in 32 layers
    assert base - panel.estimate.n_params == 32 * 2 * (4096 * 3072 + 3072)
    _set(panel, "ffn_hidden", "11008")
    _set(panel, "mlp", "swiglu")
    assert panel.estimate.ffn_hidden == 11008 and panel.estimate.mlp == "swiglu"
    _set(panel, "kv_heads", "5")
    assert "must divide" in panel.errors()["kv_heads"]


def test_tensor_pipeline_and_sequence_parallel(panel: EstimatorPanel) -> None:
    _set(panel, "model", "llama-2-70b")
    _set(panel, "gpus", "64")
    _set(panel, "tensor_parallel", "8")
    _set(panel, "pipeline_parallel", "4")
    _set(panel, "sequence_parallel", True)
    e = panel.estimate
    assert (e.tensor_parallel, e.pipeline_parallel, e.data_parallel) == (8, 4, 2)
    assert e.sequence_parallel is True and panel.errors() == {}
    assert "tp 8 x pp 4 x dp 2" in panel._ax_setup.get_xticklabels()[0].get_text()
    assert "GPU split" in panel.summary.value and "before ZeRO" in panel.summary.value
    assert panel.chart_data()["parameters"][0] == pytest.approx(e.params_bytes / GIB)
    _set(panel, "tensor_parallel", "3")
    assert "must divide" in panel.errors()["tensor_parallel"]
    _set(panel, "tensor_parallel", "8")
    _set(panel, "gpus", "60")
    assert "multiple of" in panel.errors()["gpus"]


def test_the_peaks_settings_are_fields(panel: EstimatorPanel) -> None:
    """Attention, dropout, accumulation, optimizer implementation and chunked loss change
    the peak as the estimator says; the transient terms get their own segments."""
    _set(panel, "model", "llama-3-8b")
    sdpa = panel.estimate
    assert sdpa.attention == "sdpa" and sdpa.dropout is False  # Llama trains without
    _set(panel, "attention", "eager")
    _set(panel, "checkpointing", "none")
    eager = panel.estimate
    assert eager.attention == "eager" and eager.activation_bytes > sdpa.activation_bytes
    _set(panel, "dropout", "on")
    assert panel.estimate.dropout is True
    assert panel.estimate.activation_bytes > eager.activation_bytes
    _set(panel, "optimizer_impl", "for-loop")
    assert panel.estimate.optimizer_impl == "for-loop"
    _set(panel, "grad_accum", "4")
    assert panel.estimate.grad_accum == 4
    _set(panel, "loss_chunks", "8")
    assert panel.estimate.loss_chunks == 8
    e = panel.estimate
    data = panel.chart_data()
    parts = segment_bytes(e)
    assert [data[k][0] for k in parts] == pytest.approx([v / GIB for v in parts.values()])
    assert "peak of a step" in panel.summary.value


def test_the_dry_run_button_measures_the_setup_beside_the_formula() -> None:
    """A preset simulated on fake tensors off the kernel's thread: its peak shows in the
    summary next to the formula's; a setup it cannot simulate says why, nothing runs."""
    p = EstimatorPanel(model="gpt2", precision="amp-bf16", checkpointing="none", zero_stage=0)
    try:
        _set(p, "gpus", "1")
        _set(p, "seq_len", "128")
        assert p.start_dry_run()
        p.wait_for_dry_run()
        (run,) = p.dry_runs.values()
        assert not isinstance(run, Exception), run
        assert run.params_bytes == p.estimate.params_bytes  # the same model, counted alike
        assert "peak of a step, dry run" in p.summary.value and "dry run:" in p.dry_status.value
        assert p.start_dry_run() and len(p.dry_runs) == 1  # cached for this setup
        _set(p, "zero_stage", 2)
        _set(p, "offload_optimizer", True)
        assert not p.start_dry_run() and "offload is not" in p.dry_status.value
        assert len(p.dry_runs) == 1
    finally:
        p.close()


def test_lora_and_qlora_in_the_panel() -> None:
    """LoRA rank and QLoRA are inputs: the peak drops by what the estimator says, the
    adapters' terms are drawn in their segments, and a bad rank is said beside the field."""
    p = EstimatorPanel(model="llama-2-7b", precision="amp-bf16", checkpointing="full", zero_stage=0)
    try:
        _set(p, "gpus", "1")
        full = p.estimate
        _set(p, "lora_rank", "16")
        lora = p.estimate
        assert lora.lora_params == 39_976_960 and lora.peak_bytes < full.peak_bytes
        p.fields["qlora"].widget.value = True
        p.recompute()
        qlora = p.estimate
        assert qlora.qlora_params > 0 and qlora.peak_bytes < lora.peak_bytes
        parts = segment_bytes(qlora)
        assert sum(parts.values()) == qlora.peak_bytes + qlora.overhead_bytes
        _set(p, "lora_rank", "-1")
        assert "LoRA rank (0: off)" in p.fields["lora_rank"].error.value
        assert p.estimate is qlora  # the last good estimate stays
    finally:
        p.close()
