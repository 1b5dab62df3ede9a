"""ZeRO-3's gathered layers and its step's gradient copies, as DeepSpeed 0.19 makes them.

Stage 3 gathers each layer in the dtype its partitions are held in (fp32 under fp32 and
amp-*, whose autocast casts per matmul after the gather), and its step
(`stage3.py` `_prepare_fp32_grad_for_sub_group`) flattens one sub-group's gradient
partitions into a new tensor and upcasts it to fp32 in every precision, freeing it after
that sub-group's step. The dry run of DeepSpeed's engine measures both
(tests/integration/test_dry_run_deepspeed.py: ZeRO-3 gathered parameters equal, the
optimizer step's total within 0.1%).
"""

from __future__ import annotations

import pytest

from workbench.estimate import estimate_memory
from workbench.estimate.problems import EstimateInputError

SHAPE = dict(layers=2, hidden=128, heads=4, seq_len=128, vocab=512, micro_batch=2)
GATHERED = "ZeRO-3 gathered parameters"
FP32_GRAD = "DeepSpeed fp32 gradient partition"
FLAT = "DeepSpeed flattened gradient partition"


@pytest.mark.parametrize(("precision", "width"), [("fp32", 4), ("amp-bf16", 4), ("bf16", 2)])
def test_stage_3_gathers_in_the_dtype_of_its_partitions(precision: str, width: int) -> None:
    """This model's 478,720 parameters are under DeepSpeed's prefetch bucket (5e7) and its
    live-parameter limit (1e9): every one is gathered at the forward's end, `width` bytes
    each (fp32 under amp-bf16 too: the partitions are fp32 there)."""
    e = estimate_memory(**SHAPE, precision=precision, zero_stage=3, gpus=2, optimizer_impl="fused")
    assert e.n_params == 478_720
    assert e.peak.points["forward end"][GATHERED] == width * 478_720


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
def test_stage_3_steps_on_an_fp32_copy_of_the_gradient_partition(precision: str) -> None:
    gpus = 2
    e = estimate_memory(
        **SHAPE, precision=precision, zero_stage=3, gpus=gpus, optimizer_impl="fused"
    )
    step = e.peak.points["optimizer step"]
    partition = -(-e.n_params // gpus)
    assert step[FP32_GRAD] == 4 * partition
    # under 16-bit training the 16-bit flat copy is alive with it for the upcast
    assert step.get(FLAT, 0) == (2 * partition if precision == "bf16" else 0)


def test_a_smaller_sub_group_is_whole_parameters_past_its_size() -> None:
    """DeepSpeed closes a sub-group once it holds `sub_group_size` elements or more, whole
    parameters each: with 10,000 over 2 ranks the shape's parameters (GPT's layout, in
    order: token embedding 512 x 128, positions 128 x 128, then per layer two layer norms,
    QKV 384 x 128 and its bias, the output projection, ...) make groups of 32,768 (the
    embedding's half alone), 8,192 + 2 x 64 + 24,576 = 32,896 (positions, a norm, the QKV
    matrix) and 192 + 8,192 + 3 x 64 + 32,768 = 41,344 (QKV's bias, the output projection
    and its bias, a norm, the MLP's first matrix): the largest, not 10,000."""
    ds = {"zero_optimization": {"sub_group_size": 10_000}}
    e = estimate_memory(
        **SHAPE, precision="bf16", zero_stage=3, gpus=2, optimizer_impl="fused", deepspeed_config=ds
    )
    step = e.peak.points["optimizer step"]
    assert step[FP32_GRAD] == 4 * 41_344
    assert step[FLAT] == 2 * 41_344


def test_without_the_parameters_shapes_the_sub_group_size_bounds_it_from_below() -> None:
    """LoRA's adapters (rank 64 on every linear layer of the shape: 2 x (64 x (128 + 384) +
    64 x 256 + 2 x 64 x 640) = 262,144, 131,072 a rank) are not walked: the copy is counted
    at `sub_group_size`, the least DeepSpeed's groups hold."""
    ds = {"zero_optimization": {"sub_group_size": 10_000}}
    e = estimate_memory(
        n_params=478_720, layers=2, hidden=128, heads=4, seq_len=128, vocab=512,
        micro_batch=2, precision="bf16", zero_stage=3, gpus=2, optimizer_impl="fused",
        deepspeed_config=ds, lora_rank=64,
    )  # fmt: skip
    step = e.peak.points["optimizer step"]
    assert step[FP32_GRAD] == 4 * 10_000


@pytest.mark.parametrize("value", [1.5, -3, "1e9"])
def test_a_bad_sub_group_size_is_refused_naming_the_key(value: object) -> None:
    ds = {"zero_optimization": {"sub_group_size": value}}
    with pytest.raises(
        EstimateInputError,
        match=(
            rf"zero_optimization.sub_group_size {value!r}: must be a whole number of elements "
            r"from 0 to 10\^13"
        ),
    ):
        estimate_memory(**SHAPE, zero_stage=3, gpus=2, deepspeed_config=ds)
    # DeepSpeed 0.19's reduce bucket must hold something (`gt=0`); its other sizes `ge=0`
    with pytest.raises(EstimateInputError, match=r"reduce_bucket_size 0: .* from 1 to 10\^13"):
        bucket = {"zero_optimization": {"reduce_bucket_size": 0}}
        estimate_memory(**SHAPE, zero_stage=2, gpus=2, deepspeed_config=bucket)


def test_a_sub_group_size_of_0_makes_a_group_of_each_parameter() -> None:
    """DeepSpeed accepts 0 (`ge=0`): every parameter closes its own group, so the copy is
    the largest parameter's partition, the token embedding's half: 512 x 128 / 2."""
    ds = {"zero_optimization": {"sub_group_size": 0}}
    e = estimate_memory(**SHAPE, precision="bf16", zero_stage=3, gpus=2, deepspeed_config=ds)
    assert e.peak.points["optimizer step"][FP32_GRAD] == 4 * 32_768


def test_stage_3_s_keys_are_read_under_deepspeed_s_field_names_too() -> None:
    """DeepSpeed reads `max_live_parameters` as `stage3_max_live_parameters` (its field's
    name beside the alias). Even at 0 what runs is gathered: the formula counts the layer
    (a floor: docs/dry_run.md), GPT's layer of hidden 128
    (12 x 128^2 + 13 x 128 = 198,272 parameters) in bf16, with the 50-element prefetch:
    min(all, max(0, the layer), the layer + 50)."""
    for key in ("max_live_parameters", "stage3_max_live_parameters"):
        ds = {"zero_optimization": {key: 0, "prefetch_bucket_size": 50}}
        e = estimate_memory(**SHAPE, precision="bf16", zero_stage=3, gpus=2, deepspeed_config=ds)
        assert e.peak.points["forward end"][GATHERED] == 2 * 198_272


def test_offloaded_optimizer_makes_no_copy_on_the_gpu() -> None:
    e = estimate_memory(
        **SHAPE,
        precision="bf16",
        zero_stage=3,
        gpus=2,
        optimizer_impl="fused",
        offload_optimizer=True,
    )
    assert FP32_GRAD not in e.peak.points["optimizer step"]
