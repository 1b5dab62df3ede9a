"""The estimator's `compile` setting: the peak lower by its term "recomputed under
torch.compile" (`workbench.estimate.compiled`), mapped from TrainConfig, declared once
(flag, panel field), refused when it is not a bool."""

from __future__ import annotations

import pytest

from workbench import TrainConfig
from workbench.estimate import EstimateInputError, estimate_memory
from workbench.estimate.compiled import COMPILE_TERM
from workbench.estimate.schema import SCHEMA, panel_fields
from workbench.prediction import estimator_inputs, predict_memory

LLAMA = {"model": "llama-3-8b", "precision": "bf16-true", "micro_batch": 1}
# llama-3-8b: 32 layers, seq 8192, hidden 4096, MLP inner 14336, 32 heads; transformers'
# RMSNorms (`norm_impl` "llama"): compiled, each of the 2 x 32 + 1 norms keeps its input and
# recomputes its fp32 copy of it and the normalised input, 4 + e - e = 4 bytes an element
NORMS = (2 * 32 + 1) * 4 * 8192 * 4096


def _term(e) -> int:
    """The term at each point of the step, one value (it is the same wherever it stands)."""
    values = {-terms[COMPILE_TERM] for terms in e.peak.points.values() if COMPILE_TERM in terms}
    assert len(values) == 1
    return values.pop()


def test_a_gated_mlp_compiled_keeps_the_silu_output_less_per_layer() -> None:
    eager = estimate_memory(**LLAMA)
    compiled = estimate_memory(**LLAMA, compile=True)
    term = 32 * 2 * 8192 * 1 * 14336 + NORMS  # layers x the SiLU output, e·sbf; the norms
    assert _term(compiled) == term
    assert compiled.peak.terms[COMPILE_TERM] == -term
    assert eager.peak_bytes - compiled.peak_bytes == term
    assert COMPILE_TERM not in eager.peak.terms
    for point, terms in compiled.peak.points.items():  # every point, less by the term or 0
        assert sum(eager.peak.points[point].values()) - sum(terms.values()) in (0, term)


def test_transformers_eager_attention_in_16_bits_also_drops_the_fp32_probabilities() -> None:
    kw = {**LLAMA, "attention": "eager", "seq_len": 1024}
    a, s, b = 32, 1024, 1
    silu = 32 * 2 * s * b * 14336
    scores = 32 * (2 * a * s * s * b - 2 * 4 * a * s * b)
    norms = NORMS // 8  # 1024 tokens, not 8192; fp32 too: (4 + 4) - 4 bytes an element
    assert _term(estimate_memory(**kw, compile=True)) == silu + scores + norms
    fp32 = estimate_memory(**{**kw, "precision": "fp32"}, compile=True)
    assert _term(fp32) == 2 * silu + norms


@pytest.mark.parametrize("mode", ["selective-op", "full"])
def test_recomputed_layers_keep_no_pointwise_intermediate_to_drop(mode) -> None:
    eager = estimate_memory(**LLAMA, checkpointing=mode)
    compiled = estimate_memory(**LLAMA, checkpointing=mode, compile=True)
    assert compiled.peak_bytes == eager.peak_bytes
    assert COMPILE_TERM not in compiled.peak.terms


def test_a_gelu_mlp_drops_nothing_of_the_formula() -> None:
    shape = {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 100}
    assert estimate_memory(**shape, compile=True).peak_bytes == estimate_memory(**shape).peak_bytes


def test_pipeline_stages_count_every_micro_batch_in_flight() -> None:
    kw = {**LLAMA, "pipeline_parallel": 4, "gpus": 4}
    # the first stage: 8 layers (2 norms each) for each of 4 micro-batches in flight, and
    # not the final norm (on the last stage)
    per_layer = 2 * 8192 * 14336 + 2 * 4 * 8192 * 4096
    assert _term(estimate_memory(**kw, compile=True)) == 8 * 4 * per_layer


def test_activation_offload_takes_the_term_off_the_hosts_share() -> None:
    eager = estimate_memory(**LLAMA, activation_offload=True)
    compiled = estimate_memory(**LLAMA, activation_offload=True, compile=True)
    key = "offloaded activations (host)"
    term = 32 * 2 * 8192 * 14336 + NORMS
    assert eager.peak.host_terms[key] - compiled.peak.host_terms[key] == term
    assert COMPILE_TERM not in compiled.peak.terms


def test_the_session_setting_maps_to_the_estimators() -> None:
    assert estimator_inputs(TrainConfig(compile=True))["compile"] is True
    assert estimator_inputs({"compile": False})["compile"] is False

    class Llama:  # a model description with a gated MLP's shape
        n_params = 10**8
        architecture = None
        layers, hidden, heads, seq_len, vocab = 4, 512, 8, 256, 1000

    eager = predict_memory(TrainConfig(), Llama())
    compiled = predict_memory(TrainConfig(compile=True), Llama())
    assert compiled.peak_bytes == eager.peak_bytes  # GPT's shape: a GELU MLP, nothing dropped


def test_the_keyword_is_declared_once_with_its_flag_and_panel_field() -> None:
    field = SCHEMA["compile"]
    assert field.cli_flag == "--compile" and field.config_field == "compile"
    assert "compile" in panel_fields("step")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_compile_must_be_a_bool(value) -> None:
    with pytest.raises(EstimateInputError, match=r"compile=.*must be True or False"):
        estimate_memory(**LLAMA, compile=value)


def _report(predicted):
    from workbench.train.measure.memory import MemoryReport

    return MemoryReport(
        params_bytes=0,
        grads_bytes=0,
        optimizer_bytes=0,
        optimizer_step_counter_bytes=0,
        activation_bytes=0,
        parameter_saved_bytes=0,
        activation_bytes_by_dtype={},
        micro_batch=1,
        precision="bf16-true",
        optimizer="adamw",
        activation_checkpointing="none",
        world_size=1,
        n_params=1,
        cuda_max_allocated_bytes=None,
        peak_rss_bytes=None,
        predicted=predicted,
        activation_offload=bool(predicted.peak.host_terms),
    )


@pytest.mark.parametrize("offload", [False, True])
def test_the_sessions_activation_prediction_is_less_by_the_term(offload) -> None:
    """`Session.memory()`'s predicted activations (what a compiled probe keeps) drop by the
    term; offloaded, the host's share drops by it and the device's is unchanged."""
    kw = {**LLAMA, "activation_offload": offload}
    eager = _report(estimate_memory(**kw))
    compiled = _report(estimate_memory(**kw, compile=True))
    term = 32 * 2 * 8192 * 14336 + NORMS
    assert compiled.predicted.peak.compile_not_kept_bytes == term
    device = eager.predicted_activation_bytes - compiled.predicted_activation_bytes
    host = (
        eager.predicted_offloaded_activation_bytes - compiled.predicted_offloaded_activation_bytes
    )
    assert (device, host) == ((0, term) if offload else (term, 0))


def test_the_cpu_math_kernel_keeps_its_dropout_mask_as_bool_when_compiled() -> None:
    shape = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100}
    kw = {**shape, "attention": "math", "dropout": True, "micro_batch": 2}
    assert _term(estimate_memory(**kw, compile=True)) == 2 * 3 * 4 * 32 * 32 * 2
