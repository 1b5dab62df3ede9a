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

SHAPE = dict(layers=2, hidden=128, heads=4, seq_len=128, vocab=512, micro_batch=2)
GATHERED = "ZeRO-3 gathered parameters"
FP32_GRAD = "DeepSpeed fp32 gradient partition"
FLAT = "DeepSpeed flattened gradient partition"


@pytest.mark.parametrize(("precision", "width"), [("fp32", 4), ("amp-bf16", 4), ("bf16", 2)])
def test_stage_3_gathers_in_the_dtype_of_its_partitions(precision: str, width: int) -> None:
    e = estimate_memory(**SHAPE, precision=precision, zero_stage=3, gpus=2, optimizer_impl="fused")
    bf16 = estimate_memory(**SHAPE, precision="bf16", zero_stage=3, gpus=2, optimizer_impl="fused")
    gathered = e.peak.points["forward end"][GATHERED]
    assert gathered * 2 == bf16.peak.points["forward end"][GATHERED] * width


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


def test_a_smaller_sub_group_bounds_the_copy() -> None:
    ds = {"zero_optimization": {"sub_group_size": 10_000}}
    e = estimate_memory(
        **SHAPE, precision="bf16", zero_stage=3, gpus=2, optimizer_impl="fused", deepspeed_config=ds
    )
    step = e.peak.points["optimizer step"]
    assert step[FP32_GRAD] == 4 * 10_000
    assert step[FLAT] == 2 * 10_000


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
