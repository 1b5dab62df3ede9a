"""Estimator figures pinned to published and hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workbench.config import OptimizerName, Precision
from workbench.estimate import (
    GIB,
    GPUS,
    EstimateInputError,
    ModelStateQuery,
    bytes_per_param,
    compare_stages,
    estimate_memory,
    get_gpu,
    model_state_bytes,
    params_from_shape,
    transformer_activation_bytes,
)

GPT3 = dict(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=50257)


# ------------------------------------------------------------------ model states
def test_175b_fp32_adamw_no_zero_is_2_8_tb():
    e = estimate_memory(n_params=175e9, precision="fp32", optimizer="adamw", zero_stage=0, gpus=1)
    assert e.params_bytes == 700 * 10**9
    assert e.grads_bytes == 700 * 10**9
    assert e.optimizer_bytes == 1400 * 10**9
    assert e.total_bytes == 2800 * 10**9
    assert e.activation_bytes is None
    assert e.cpu_offload_bytes == 0


def test_zero_paper_figure_1_at_paper_rounding():
    stages = compare_stages(n_params=7.5e9, precision="fp16", optimizer="adam", gpus=64)
    assert [round(e.total_bytes / 1e9, 1) for e in stages] == [120.0, 31.4, 16.6, 1.9]
    assert [e.zero_stage for e in stages] == [0, 1, 2, 3]


def test_zero_stage_columns_for_7_5b_on_64_gpus():
    shard = 7_500_000_000 // 64  # divides exactly
    s1 = estimate_memory(n_params=7.5e9, precision="bf16", optimizer="adamw", zero_stage=1, gpus=64)
    assert (s1.params_bytes, s1.grads_bytes, s1.optimizer_bytes) == (15e9, 15e9, 12 * shard)
    s2 = estimate_memory(n_params=7.5e9, precision="bf16", zero_stage=2, gpus=64)
    assert (s2.params_bytes, s2.grads_bytes, s2.optimizer_bytes) == (15e9, 2 * shard, 12 * shard)
    s3 = estimate_memory(n_params=7.5e9, precision="bf16", zero_stage=3, gpus=64)
    assert (s3.params_bytes, s3.grads_bytes, s3.optimizer_bytes) == (
        2 * shard,
        2 * shard,
        12 * shard,
    )


@pytest.mark.parametrize(
    ("precision", "optimizer", "expected"),
    [
        ("fp32", "adamw", (4, 4, 8)),
        ("fp32", "sgd", (4, 4, 4)),
        ("fp32", "sgd-nomomentum", (4, 4, 0)),
        ("fp32", "adam8bit", (4, 4, 2)),
        ("amp-fp16", "adam", (4, 4, 8)),
        ("amp-bf16", "sgd", (4, 4, 4)),
        ("fp16", "adam", (2, 2, 12)),  # K = 12: fp32 master + two fp32 states
        ("bf16", "sgd", (2, 2, 8)),
        ("bf16", "sgd-nomomentum", (2, 2, 4)),  # the master copy alone
        ("fp16", "adam8bit", (2, 2, 6)),
    ],
)
def test_bytes_per_parameter(precision, optimizer, expected):
    per = bytes_per_param(Precision(precision), OptimizerName(optimizer))
    assert (per.weights, per.grads, per.optimizer) == expected
    e = estimate_memory(n_params=1000, precision=precision, optimizer=optimizer)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == tuple(1000 * x for x in expected)


def test_sharding_rounds_up_per_gpu():
    e = estimate_memory(n_params=10, precision="fp32", optimizer="adam", zero_stage=3, gpus=3)
    # ceil(10 / 3) = 4 parameters on every GPU
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (16, 16, 32)
    assert 3 * e.total_bytes >= estimate_memory(n_params=10, optimizer="adam").total_bytes


def test_stage_zero_replicates_on_every_gpu():
    one = estimate_memory(n_params=1e9, precision="bf16")
    many = estimate_memory(n_params=1e9, precision="bf16", gpus=512)
    assert one.total_bytes == many.total_bytes


def test_optimizer_offload_moves_gradients_and_optimizer_states_to_cpu():
    base = estimate_memory(n_params=1e9, precision="bf16", zero_stage=2, gpus=8)
    off = estimate_memory(
        n_params=1e9, precision="bf16", zero_stage=2, gpus=8, offload_optimizer=True
    )
    assert off.params_bytes == base.params_bytes == 2 * 10**9
    assert off.grads_bytes == off.optimizer_bytes == 0
    assert off.cpu_offload_bytes == base.grads_bytes + base.optimizer_bytes
    assert off.total_bytes + off.cpu_offload_bytes == base.total_bytes


def test_parameter_offload_moves_the_parameter_shard():
    kw = dict(n_params=1e9, precision="bf16", zero_stage=3, gpus=4, offload_optimizer=True)
    base = estimate_memory(**kw)
    both = estimate_memory(**kw, offload_params=True)
    assert both.params_bytes == 0 and both.total_bytes == 0
    assert both.cpu_offload_bytes == base.cpu_offload_bytes + base.params_bytes == 16 * 250_000_000


def test_parameter_count_from_shape_gpt3():
    n = params_from_shape(layers=96, hidden=12288, seq_len=2048, vocab=50257)
    h = 12288
    assert n == 12 * 96 * h * h + 13 * 96 * h + 50257 * h + 2048 * h + 2 * h
    assert n == 174_604_259_328  # "175B"
    assert estimate_memory(**GPT3).n_params == n


def test_gpu_limit_uses_the_parameter_count_derived_from_the_shape():
    tiny = dict(layers=1, hidden=1, heads=1, seq_len=1, vocab=1)
    n = params_from_shape(layers=1, hidden=1, seq_len=1, vocab=1)
    assert n == 12 + 13 + 1 + 1 + 2
    assert estimate_memory(**tiny, gpus=n).gpus == n
    with pytest.raises(ValueError, match=rf"gpus={n + 1}: must not exceed the parameter count"):
        estimate_memory(**tiny, gpus=n + 1)


def test_explicit_n_params_wins_over_shape_for_model_states():
    e = estimate_memory(n_params=1000, **GPT3)
    assert e.n_params == 1000 and e.params_bytes == 4000
    assert e.activation_bytes is not None and e.activation_bytes > 0


# ------------------------------------------------------------------ activations
S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B, micro-batch 1
SBH = S * B * H  # 25,165,824
AS2B = A * S * S * B  # 402,653,184


def test_korthikanti_table_2_per_layer_gpt3():
    kw = dict(layers=96, hidden=H, heads=A, seq_len=S, micro_batch=B, vocab=50257)
    none = transformer_activation_bytes(**kw, checkpointing="none")
    selective = transformer_activation_bytes(**kw, checkpointing="selective")
    full = transformer_activation_bytes(**kw, checkpointing="full")
    assert none.per_layer_bytes == SBH * (34 + 5 * A * S // H) == 2_868_903_936
    assert 5 * A * S / H == 80  # the paper's "5as/h = 80 for GPT-3"
    assert selective.per_layer_bytes == 34 * SBH == 855_638_016
    assert full.per_layer_bytes == 2 * SBH == 50_331_648
    assert none.per_layer_element_bytes == 2 * (16 * SBH + 2 * AS2B)
    assert none.per_layer_mask_bytes == 2 * SBH + AS2B


def test_gpt3_full_checkpointing_total_by_hand():
    b = transformer_activation_bytes(
        layers=96, hidden=H, heads=A, seq_len=S, micro_batch=1, vocab=50257, checkpointing="full"
    )
    layers = 96 * 2 * SBH  # 2sbhL = 4,831,838,208
    recompute = SBH * (34 + 80) - 2 * SBH  # one layer recomputed; its input is already stored
    embedding = SBH  # input dropout mask
    logits = 4 * S * 50257
    output = 2 * SBH + 2 * SBH + logits  # final LN input, output projection input, fp32 logits
    assert (b.layers_bytes, b.recompute_bytes) == (layers, recompute)
    assert (b.embedding_bytes, b.logits_bytes, b.output_bytes) == (embedding, logits, output)
    assert b.total_bytes == layers + recompute + embedding + output == 8_187_944_960


def test_fp32_activations_double_only_element_terms():
    kw = dict(layers=2, hidden=64, heads=4, seq_len=32, micro_batch=3, vocab=65)
    half = transformer_activation_bytes(**kw, activation_bytes_per_element=2)
    full = transformer_activation_bytes(**kw, activation_bytes_per_element=4)
    assert full.per_layer_element_bytes == 2 * half.per_layer_element_bytes
    assert full.per_layer_mask_bytes == half.per_layer_mask_bytes
    sbh, as2b = 32 * 3 * 64, 4 * 32 * 32 * 3
    assert full.per_layer_bytes == 66 * sbh + 9 * as2b
    assert full.logits_bytes == half.logits_bytes == 4 * 32 * 3 * 65


def test_without_dropout_no_masks_and_one_score_tensor():
    kw = dict(layers=2, hidden=64, heads=4, seq_len=32, micro_batch=1, vocab=65)
    b = transformer_activation_bytes(**kw, dropout=False)
    sbh, as2b = 32 * 64, 4 * 32 * 32
    assert b.per_layer_mask_bytes == 0 and b.embedding_bytes == 0
    assert b.per_layer_bytes == 32 * sbh + 2 * as2b


def test_one_layer_all_checkpointing_modes_agree():
    kw = dict(layers=1, hidden=64, heads=4, seq_len=32, micro_batch=2, vocab=65)
    totals = {
        m: transformer_activation_bytes(**kw, checkpointing=m).total_bytes
        for m in ("none", "selective", "full")
    }
    assert len(set(totals.values())) == 1


def test_estimate_uses_16_bit_activations_except_for_fp32():
    kw = dict(**GPT3, micro_batch=2)
    for precision, element in (("fp32", 4), ("amp-bf16", 2), ("fp16", 2)):
        e = estimate_memory(**kw, precision=precision)
        assert e.activations is not None
        assert e.activations.activation_bytes_per_element == element
        assert (
            e.total_bytes == e.params_bytes + e.grads_bytes + e.optimizer_bytes + e.activation_bytes
        )


def test_activations_are_linear_in_micro_batch():
    one = estimate_memory(**GPT3, micro_batch=1, checkpointing="selective").activation_bytes
    seven = estimate_memory(**GPT3, micro_batch=7, checkpointing="selective").activation_bytes
    assert seven == 7 * one


def test_public_helpers_reject_bad_sizes_and_names():
    with pytest.raises(
        ValueError,
        match=r"transformer_activation_bytes: layers=0, hidden=1.5, micro_batch=True: each "
        r"must be an integer >= 1",
    ):
        transformer_activation_bytes(
            layers=0, hidden=1.5, heads=2, seq_len=4, micro_batch=True, vocab=5
        )
    with pytest.raises(ValueError, match=r"dropout='no': must be True or False"):
        transformer_activation_bytes(
            layers=1, hidden=8, heads=2, seq_len=4, micro_batch=1, vocab=5, dropout="no"
        )
    with pytest.raises(ValueError, match=r"params_from_shape: vocab=-5: each must be"):
        params_from_shape(layers=1, hidden=8, seq_len=4, vocab=-5)
    with pytest.raises(
        ValueError,
        match=r"precision='fp8': must be one of fp32, .*; optimizer='rmsprop9': must be one of adamw",
    ):
        bytes_per_param("fp8", "rmsprop9")
    assert bytes_per_param("bf16", "adam") == bytes_per_param(Precision.BF16, OptimizerName.ADAM)
    with pytest.raises(ValueError, match=r"accounting='nope': must be one of paper"):
        model_state_bytes(
            ModelStateQuery(10, Precision.FP32, OptimizerName.ADAM, 0, 1, False, False), "nope"
        )


def test_bad_checkpointing_name_in_activation_function():
    with pytest.raises(
        ValueError,
        match=r"checkpointing='some': must be one of none, selective, selective-op, full",
    ):
        transformer_activation_bytes(
            layers=1, hidden=8, heads=2, seq_len=4, micro_batch=1, vocab=5, checkpointing="some"
        )


# ------------------------------------------------------------------ GPU, fits, max batch
@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("h100", "h100-80gb"),
        ("h100-80gb", "h100-80gb"),
        ("H100 80GB", "h100-80gb"),
        ("NVIDIA H100 SXM5 80GB", "h100-80gb"),
        ("A100-80GB", "a100-80gb"),
        ("a100_40gb", "a100-40gb"),
        ("V100-32GB", "v100-32gb"),
        ("RTX 4090", "rtx-4090"),
        ("3090", "rtx-3090"),
        ("h200", "h200-141gb"),
        ("MI300X", "mi300x"),
        ("l40s", "l40s"),
        ("T4", "t4"),
        # names as drivers report them (torch.cuda.get_device_name(), nvidia-smi)
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("Tesla V100-SXM2-16GB", "v100-16gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA H200", "h200-141gb"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_gpu_lookup_is_forgiving(name, canonical):
    assert get_gpu(name).name == canonical


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL"])
def test_boards_with_other_peak_rates_are_not_matched_to_sxm_parts(name):
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu(name)


# Vendor data sheets, dense (no sparsity) peak TFLOPS: memory in GB as sold, FP16 and BF16
# tensor rates (FP32 accumulate), FP32 non-tensor rate (MI300X: FP32 matrix), TF32 tensor.
DATA_SHEETS = {
    "v100-16gb": (16, 125, None, 15.7, None),
    "v100-32gb": (32, 125, None, 15.7, None),
    "t4": (16, 65, None, 8.1, None),
    "a10g": (24, 70, 70, 35, 35),
    "l4": (24, 121, 121, 30.3, 60),  # sheet: 242 / 120 with sparsity
    "rtx-3090": (24, 71, 71, 35.6, 35.6),  # GA102 whitepaper
    "rtx-4090": (24, 165.2, 165.2, 82.6, 82.6),  # Ada whitepaper
    "a100-40gb": (40, 312, 312, 19.5, 156),
    "a100-80gb": (80, 312, 312, 19.5, 156),
    "l40s": (48, 362.05, 362.05, 91.6, 183),  # sheet: 733 / 366 with sparsity
    "h100-80gb": (80, 989.5, 989.5, 67, 494.5),  # sheet: 1979 / 989 with sparsity
    "h200-141gb": (141, 989.5, 989.5, 67, 494.5),
    "mi300x": (192, 1307.4, 1307.4, 163.4, 653.7),
}


def test_catalog_matches_the_data_sheets():
    assert set(GPUS) == set(DATA_SHEETS)
    for name, (gb, fp16, bf16, fp32, tf32) in DATA_SHEETS.items():
        g = GPUS[name]
        assert g.data_sheet_bytes == gb * GIB, name
        assert g.peak_fp16_flops == pytest.approx(fp16 * 1e12), name
        assert g.peak_fp32_flops == pytest.approx(fp32 * 1e12), name
        for got, want in ((g.peak_bf16_flops, bf16), (g.peak_tf32_flops, tf32)):
            assert (got is None) == (want is None), name
            assert want is None or got == pytest.approx(want * 1e12), name
        assert g.source and g.description


#: What PyTorch reports as each part's total memory, GiB (the lowest published report naming
#: the part; each source is in the catalog's `memory_source`).
VISIBLE_GIB = {
    "v100-16gb": 15.78, "v100-32gb": 31.74, "t4": 14.56, "a10g": 22.49, "l4": 22.03,
    "rtx-3090": 23.70, "rtx-4090": 23.52, "a100-40gb": 39.50, "a100-80gb": 79.14,
    "l40s": 44.42, "h100-80gb": 79.11, "h200-141gb": 139.81, "mi300x": 191.98,
}  # fmt: skip


def test_the_fit_is_held_against_the_memory_programs_see_not_the_data_sheet():
    """An H100 "80GB" shows 79.11 GiB to PyTorch, a T4 "16GB" 14.56: the capacity each
    estimate fits against is that, each figure quoted with where it was published."""
    assert set(VISIBLE_GIB) == set(GPUS)
    for name, gib in VISIBLE_GIB.items():
        g = GPUS[name]
        assert g.memory_bytes == round(gib * GIB), name
        assert g.memory_bytes < g.data_sheet_bytes, name
        assert f"{gib:.2f}".rstrip("0").rstrip(".") in g.memory_source, name
    # a peak that fits 80 GiB but not 79.11 does not fit an H100
    e = estimate_memory(n_params=4.9e9, gpus=1, precision="bf16", zero_stage=0, gpu="h100")
    assert e.gpu_memory_bytes == GPUS["h100-80gb"].memory_bytes
    assert e.fits == (e.required_bytes <= GPUS["h100-80gb"].memory_bytes)


def test_unknown_and_ambiguous_gpu_names():
    with pytest.raises(
        ValueError, match=r"gpu='b300': unknown GPU; known GPUs: v100-16gb, .*mi300x"
    ):
        get_gpu("b300")
    with pytest.raises(ValueError, match=r"gpu='a100': is ambiguous: .*a100-40gb, a100-80gb"):
        estimate_memory(n_params=1e9, gpu="a100")


def test_fits_compares_total_plus_overhead_with_gpu_memory():
    # 5e9 fp32 params with sgd-nomomentum: 40e9 bytes; an A100-40GB shows PyTorch 39.50 GiB,
    # 42.4e9 bytes
    kw = dict(n_params=5e9, optimizer="sgd-nomomentum", gpu="a100-40gb")
    assert estimate_memory(**kw).fits is True
    room = GPUS["a100-40gb"].memory_bytes - 40 * 10**9
    assert estimate_memory(**kw, overhead_gib=room / GIB).fits is True
    assert estimate_memory(**kw, overhead_gib=(room + 1) / GIB).fits is False
    assert estimate_memory(n_params=5e9).fits is None


def test_max_micro_batch_is_the_largest_that_fits():
    kw = dict(**GPT3, precision="bf16", zero_stage=3, gpus=1024, checkpointing="full", gpu="h100")
    e = estimate_memory(**kw)
    m = e.max_micro_batch
    assert m is not None and m >= 1
    assert estimate_memory(**kw, micro_batch=m).fits is True
    assert estimate_memory(**kw, micro_batch=m + 1).fits is False


def test_max_micro_batch_none_cases():
    assert estimate_memory(**GPT3).max_micro_batch is None  # no GPU named
    assert estimate_memory(n_params=1e6, gpu="t4").max_micro_batch is None  # no shape
    nothing = estimate_memory(**GPT3, gpu="h100")  # 2.8 TB of model states on one GPU
    assert nothing.fits is False and nothing.max_micro_batch is None


def test_overhead_is_reported_and_not_in_total():
    e = estimate_memory(n_params=1000, overhead_gib=2.5)
    assert e.overhead_bytes == int(2.5 * GIB)
    assert e.total_bytes == 16_000
    assert e.required_bytes == e.peak_bytes + e.overhead_bytes


# ------------------------------------------------------------------ compute
def test_training_flops_time_and_cost():
    e = estimate_memory(
        n_params=7e9,
        precision="bf16",
        gpus=8,
        gpu="h100",
        tokens=1e12,
        mfu=0.5,
        price_per_gpu_hour=3.0,
    )
    assert e.train_flops == 6 * 7e9 * 1e12
    assert e.train_seconds == pytest.approx(e.train_flops / (8 * 989.5e12 * 0.5))
    assert e.cost == pytest.approx(e.train_seconds / 3600 * 8 * 3.0)


def test_full_checkpointing_costs_8_flops_per_param_token():
    """The one FLOP count (workbench.estimate.flops): N without the looked-up position
    table (GPT-3's output head is its tied embedding: multiplied, so counted once), 6 N +
    12 L h s model FLOPs a token; full recomputation runs the forward again, 2 N + 4 L h s."""
    e = estimate_memory(**GPT3, checkpointing="full", tokens=300e9)
    n = e.n_params - 2048 * 12288
    attention = 12 * 96 * 12288 * 2048
    assert e.model_flops == (6 * n + attention) * 300e9
    assert e.train_flops == (8 * n + attention * 4 / 3) * 300e9


def test_fp32_uses_the_fp32_peak_and_16_bit_the_tensor_peak():
    kw = dict(n_params=1e9, gpu="a100-80gb", tokens=1e9)
    t32 = estimate_memory(**kw, precision="fp32").train_seconds
    t16 = estimate_memory(**kw, precision="amp-fp16").train_seconds
    assert t32 / t16 == pytest.approx(312 / 19.5)


def test_compute_fields_none_when_not_asked():
    e = estimate_memory(n_params=1e9, gpu="h100")
    assert (e.train_flops, e.train_seconds, e.cost) == (None, None, None)
    no_gpu = estimate_memory(n_params=1e9, tokens=1e9, price_per_gpu_hour=2)
    assert no_gpu.train_flops == 6e18 and no_gpu.train_seconds is None and no_gpu.cost is None
    no_bf16 = estimate_memory(n_params=1e9, tokens=1e9, gpu="v100-32gb", precision="bf16")
    assert no_bf16.train_seconds is None  # the V100 has no bf16 tensor rate


# ------------------------------------------------------------------ results and seams
def test_to_dict_is_json_ready_and_echoes_inputs():
    import json

    e = estimate_memory(
        **GPT3, precision="BF16", optimizer="Adam", gpu="h100", zero_stage=1, gpus=8
    )
    d = json.loads(json.dumps(e.to_dict()))
    for key in (
        "n_params",
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activation_bytes",
        "total_bytes",
        "overhead_bytes",
        "cpu_offload_bytes",
        "gpu",
        "gpu_memory_bytes",
        "fits",
        "max_micro_batch",
    ):
        assert d[key] == getattr(e, key)
    assert (d["precision"], d["optimizer"], d["zero_stage"], d["gpus"]) == ("bf16", "adam", 1, 8)
    assert d["activations"]["total_bytes"] == e.activation_bytes


def test_result_is_frozen():
    e = estimate_memory(n_params=10)
    with pytest.raises(AttributeError):
        e.total_bytes = 0  # type: ignore[misc]


def test_compare_stages_applies_offload_where_supported():
    stages = compare_stages(
        n_params=1e9, precision="bf16", gpus=4, offload_optimizer=True, offload_params=True
    )
    assert [(e.offload_optimizer, e.offload_params) for e in stages] == [
        (False, False),
        (True, False),
        (True, False),
        (True, True),
    ]
    with pytest.raises(ValueError, match="zero_stage=2: is set by compare_stages"):
        compare_stages(n_params=1e9, zero_stage=2)


def test_accounting_seam_imports_a_registered_module_lazily(monkeypatch):
    import sys
    import types

    import workbench.estimate.model_states as ms

    def doubled(q):
        base = ms.paper_model_states(q)
        return ms.ModelStates(2 * base.params_bytes, base.grads_bytes, base.optimizer_bytes, 0)

    fake = types.ModuleType("fake_layout")
    fake.model_states = doubled  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_layout", fake)
    monkeypatch.setitem(ms.ACCOUNTINGS, "fake", "fake_layout:model_states")
    monkeypatch.setattr(ms, "_RESOLVED", {})
    e = estimate_memory(n_params=100, accounting="fake")
    assert e.params_bytes == 800 and e.grads_bytes == 400 and e.accounting == "fake"
    assert estimate_memory(n_params=100).params_bytes == 400


def test_unknown_accounting_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"accounting='nonsense': must be one of paper, deepspeed"):
        estimate_memory(n_params=100, accounting="nonsense")


# ------------------------------------------------------------------ errors
def test_every_problem_is_reported_at_once():
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(
            n_params=-5,
            precision="fp64",
            optimizer="rmsprop9",
            zero_stage=5,
            gpus=0,
            checkpointing="some",
            gpu="tpu",
            mfu=1.5,
            overhead_gib=-1,
            tokens=math.nan,
            price_per_gpu_hour=-2,
            micro_batch=0,
        )
    fields = [p.field for p in info.value.problems]
    assert fields == [
        "n_params",
        "micro_batch",
        "precision",
        "optimizer",
        "checkpointing",
        "zero_stage",
        "gpus",
        "gpu",
        "overhead_gib",
        "tokens",
        "mfu",
        "price_per_gpu_hour",
    ]
    text = str(info.value)
    assert text.startswith("12 invalid estimate inputs:")
    assert "precision='fp64': must be one of fp32, amp-fp16, amp-bf16, fp16, bf16" in text
    assert "optimizer='rmsprop9': must be one of adamw, adam, sgd, sgd-nomomentum, adam8bit" in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(n_params=0), r"n_params=0: must be a whole number from 1 to 10\^16"),
        (dict(n_params=math.nan), r"n_params=nan: must be a whole number from 1 to 10\^16"),
        (
            dict(n_params="seven"),
            r"n_params='seven': must be a whole number from 1 to 10\^16 \(e.g. 7B, 1.5e9, 350M or 1.3T\)",
        ),
        (dict(n_params="7.5"), r"n_params='7.5': must be a whole number from 1 to 10\^16"),
        (dict(n_params="7B5"), r"n_params='7B5': must be a whole number from 1 to 10\^16"),
        (dict(n_params=1.5), r"n_params=1.5: must be a whole number"),
        (dict(n_params=True), r"n_params=True: must be a whole number"),
        (
            dict(n_params=1e9, layers=-1, hidden=8, heads=2, seq_len=4, vocab=5),
            r"layers=-1: must be an integer from 1 to 10\^5",
        ),
        (dict(n_params=1e9, zero_stage=4), r"zero_stage=4: must be 0, 1, 2 or 3"),
        (dict(n_params=1e9, zero_stage=-1), r"zero_stage=-1: must be 0, 1, 2 or 3"),
        (
            dict(n_params=1e9, offload_params=True, zero_stage=2),
            r"offload_params=True: needs zero_stage 3 \(got 2\)",
        ),
        (
            dict(n_params=1e9, offload_optimizer=True),
            r"offload_optimizer=True: needs zero_stage 1, 2 or 3 \(got 0\)",
        ),
        (
            dict(n_params=1e9, offload_optimizer="yes"),
            r"offload_optimizer='yes': must be True or False",
        ),
        (dict(n_params=10, gpus=11), r"gpus=11: must not exceed the parameter count \(10\)"),
        (
            dict(layers=2, hidden=10, heads=3, seq_len=4, vocab=5),
            r"heads=3: must divide hidden=10 evenly",
        ),
        (
            dict(layers=2, hidden=8),
            r"heads is missing: a transformer shape needs all of layers, hidden, heads, seq_len, vocab \(also missing: seq_len, vocab\)",
        ),
        (dict(), r"n_params is missing: give n_params, a model or a transformer shape"),
        (dict(n_params=1e9, mfu=0), r"mfu=0: must be a finite number from 0.001 to 1"),
        (
            dict(n_params=1e9, overhead_gib=math.inf),
            r"overhead_gib=inf: must be a finite number from 0 to 1,024",
        ),
        (dict(n_params=1e9, gpu=""), r"gpu='': must be a GPU name"),
        (dict(n_params=1e9, gpu=80), r"gpu=80: must be a GPU name"),
    ],
)
def test_invalid_inputs_name_field_value_and_allowed(kwargs, match):
    with pytest.raises(ValueError, match=match):
        estimate_memory(**kwargs)


# ------------------------------------------------------------------ hostile input
SMALL = dict(layers=2, hidden=64, heads=4, seq_len=128, vocab=100)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            dict(SMALL, seq_len=10**59),
            r"seq_len=<an integer of about 60 digits>: more than 10\^9 tokens \(the longest "
            r"contexts are about 10\^7 tokens\); allowed: an integer from 1 to 10\^9",
        ),
        (dict(SMALL, micro_batch=10**20), r"micro_batch=100000000000000000000: more than 10\^6"),
        (dict(SMALL, hidden=10**400), r"hidden=<an integer of about 401 digits>: more than 10\^6"),
        (dict(SMALL, layers=2**64), r"layers=18446744073709551616: more than 10\^5 layers"),
        (dict(SMALL, vocab=4.0), r"vocab=4.0: must be an integer from 1 to 10\^9"),
        (dict(SMALL, kv_heads=10**7), r"kv_heads=10000000: more than 10\^6 key/value heads"),
        (dict(SMALL, ffn_hidden=0), r"ffn_hidden=0: must be an integer from 1 to 10\^7"),
        (dict(n_params=1e9, overhead_gib=1e300), r"overhead_gib=1e\+300: more than 1,024 GiB"),
        (dict(n_params=1e9, overhead_gib=10**400), r"overhead_gib=<an integer of about 401"),
        (dict(n_params=1e9, tokens=1e308), r"tokens=1e\+308: more than 10\^16 tokens"),
        (dict(n_params=1e9, tokens="1e20"), r"tokens='1e20': more than 10\^16 tokens"),
        (dict(n_params=1e9, tokens=math.nan), r"tokens=nan: must be a finite number > 0"),
        (dict(n_params=1e9, mfu=1e-300), r"mfu=1e-300: must be a finite number from 0.001 to 1"),
        (dict(n_params=1e9, mfu=2), r"mfu=2: more than 1 \(a utilisation is a fraction of the"),
        (dict(n_params=1e9, price_per_gpu_hour=math.inf), r"price_per_gpu_hour=inf: must be a"),
        (dict(n_params=1e9, price_per_gpu_hour=1e7), r"price_per_gpu_hour=10000000.0: more than"),
        (dict(n_params=1e9, price_per_gpu_hour=2.5), r"price_per_gpu_hour=2.5: the cost is of"),
        (dict(n_params=1e9, gpus=10**8), r"gpus=100000000: more than 10\^7 GPUs"),
        (dict(n_params=1e9, gpus="8"), r"gpus='8': must be an integer from 1 to 10\^7"),
        (dict(n_params=1e9, zero_stage=[1]), r"zero_stage=\[1\]: must be 0, 1, 2 or 3"),
        (dict(n_params=1e9, precision=["fp32"]), r"precision=\['fp32'\]: must be one of"),
        (dict(n_params=1e9, accounting=["paper"]), r"accounting=\['paper'\]: must be one of"),
        (dict(n_params=1e9, model="x" * 500), r"model='x{76}\.\.\.: unknown model"),
        (
            dict(model="llama-3-8b", seq_len=10**9, attention="megatron"),
            r"seq_len=1000000000: gives 3.81e\+12 GiB of activations per GPU, more than 2\^30 GiB",
        ),
    ],
)
def test_hostile_values_raise_value_errors_naming_the_field(kwargs, match):
    with pytest.raises(EstimateInputError, match=match):
        estimate_memory(**kwargs)


def test_every_range_problem_is_reported_at_once():
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(
            **dict(SMALL, seq_len=10**10, hidden=10**7, heads=0),
            micro_batch=10**7,
            gpus=math.inf,
            overhead_gib=2000,
            tokens=1e17,
            mfu=math.nan,
            price_per_gpu_hour=-1,
        )
    assert [p.field for p in info.value.problems] == [
        "hidden",
        "heads",
        "seq_len",
        "micro_batch",
        "gpus",
        "overhead_gib",
        "tokens",
        "mfu",
        "price_per_gpu_hour",
    ]


def test_numpy_scalars_are_numbers():
    e = estimate_memory(
        layers=np.int64(2),
        hidden=np.int32(64),
        heads=np.int16(4),
        seq_len=np.uint32(128),
        vocab=np.int64(100),
        micro_batch=np.int64(2),
        gpus=np.int8(1),
        zero_stage=np.int64(0),
        overhead_gib=np.float32(0.5),
        tokens=np.float64(1e9),
        mfu=np.float16(0.5),
        price_per_gpu_hour=np.int64(2),
        gpu="h100",
        sequence_parallel=np.False_,
        offload_optimizer=np.bool_(False),
    )
    plain = estimate_memory(
        **SMALL,
        micro_batch=2,
        overhead_gib=0.5,
        tokens=1e9,
        mfu=0.5,
        price_per_gpu_hour=2,
        gpu="h100",
    )
    assert e == plain
    assert type(e.micro_batch) is int and type(e.overhead_gib) is float
    with pytest.raises(EstimateInputError, match=r"micro_batch=np.True_: must be an integer"):
        estimate_memory(**SMALL, micro_batch=np.True_)
    with pytest.raises(EstimateInputError, match=r"layers=np.float64\(2.0\): must be an integer"):
        estimate_memory(**dict(SMALL, layers=np.float64(2.0)))


def test_the_largest_values_in_range_give_finite_figures():
    e = estimate_memory(
        n_params=10**16,
        tokens=1e16,
        gpu="t4",
        mfu=0.001,
        price_per_gpu_hour=10**6,
        overhead_gib=1024,
        gpus=10**7,
    )
    for value in (e.train_flops, e.train_seconds, e.cost):
        assert value is not None and math.isfinite(value)
    assert e.overhead_bytes == 1024 * GIB


def test_public_helpers_read_numpy_integers_as_python_integers():
    shape = dict(layers=2, hidden=10**6, heads=8, seq_len=10**6, micro_batch=10**5, vocab=100)
    wide = transformer_activation_bytes(**{k: np.int64(v) for k, v in shape.items()})
    assert wide == transformer_activation_bytes(**shape)  # no int64 wrap-around
    assert wide.total_bytes > 2**63
    gpt2 = dict(layers=12, hidden=768, seq_len=1024, vocab=50257)
    assert params_from_shape(**{k: np.int32(v) for k, v in gpt2.items()}) == 124_439_808
    with pytest.raises(
        ValueError, match=r"params_from_shape: layers=np.True_, hidden='10\*\*400': each must be"
    ):
        params_from_shape(layers=np.True_, hidden="10**400", seq_len=1, vocab=1)


def test_an_unknown_keyword_is_named_with_the_close_one() -> None:
    from workbench.estimate import EstimateInputError, compare_stages, estimate_memory

    with pytest.raises(
        EstimateInputError, match=r"n_parms=7000000000.0: unknown input; did you mean 'n_params'\?"
    ):
        estimate_memory(n_parms=7e9)
    with pytest.raises(
        EstimateInputError, match=r"estimate_memory\(\) takes keyword arguments only"
    ):
        estimate_memory(7e9)  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"colour=1: unknown input"):
        compare_stages(n_params="1B", colour=1)


def test_a_hand_built_query_with_unknown_names_is_a_value_error() -> None:
    from workbench.estimate import ModelStateQuery, model_state_bytes

    q = ModelStateQuery(
        n_params=10,
        precision="fp64",
        optimizer="bogus",
        zero_stage=0,
        gpus=1,
        offload_optimizer=False,
        offload_params=False,
        fsdp="off",
    )
    with pytest.raises(
        ValueError, match=r"precision='fp64': must be one of fp32.*optimizer='bogus'"
    ):
        model_state_bytes(q)
