"""accounting="deepspeed": DeepSpeed's real per-rank layout, pinned to hand-computed bytes."""

from __future__ import annotations

import pytest

from workbench.config import OptimizerName, Precision
from workbench.estimate import ACCOUNTINGS, estimate_memory
from workbench.estimate.deepspeed_layout import (
    bucket_elements,
    deepspeed_layout,
    model_states,
)
from workbench.estimate.model_states import ModelStateQuery, ModelStates


def query(**kw: object) -> ModelStateQuery:
    base: dict[str, object] = dict(
        n_params=1820,
        precision=Precision.FP32,
        optimizer=OptimizerName.ADAMW,
        zero_stage=0,
        gpus=2,
        offload_optimizer=False,
        offload_params=False,
    )
    base.update(kw)
    return ModelStateQuery(**base)  # type: ignore[arg-type]


# Ψ = 1821 parameters on N = 2 ranks, Adam (K = 8):
#   A  = ceil(1821 / 4) * 4 = 1824     (ZeRO 1/2 flat buffer, padded to 2N)
#   P  = 1824 / 2 = 912                (ZeRO 1/2 partition)
#   P3 = ceil(1821 / 2) = 911          (stage-3 partition)
#   B  = ceil(1821 / 64) * 64 = 1856   (stage-3 reduce bucket, capped at Ψ)
@pytest.mark.parametrize(
    ("precision", "stage", "expected"),
    [
        # fp32: W = 4, no master copy at stage 0, an fp32 master partition at stages 1-3
        ("fp32", 0, (4 * 1821, 4 * 1821, 8 * 1821)),
        ("fp32", 1, (4 * 1824, 4 * 912, 12 * 912)),
        ("fp32", 2, (4 * 1824, 4 * 912, 12 * 912)),
        ("fp32", 3, (4 * 911, 4 * 911 + 4 * 1856, 12 * 911)),
        # bf16: W = 2; stage 0 keeps one flat fp32 master of the whole model
        ("bf16", 0, (2 * 1821, 2 * 1821, 12 * 1821)),
        ("bf16", 1, (2 * 1824, 2 * 912, 12 * 912)),
        ("bf16", 2, (2 * 1824, 2 * 912, 12 * 912)),
        ("bf16", 3, (2 * 911, 2 * 911 + 2 * 1856, 12 * 911)),
        # amp-bf16 keeps fp32 weights and grads: same as fp32
        ("amp-bf16", 2, (4 * 1824, 4 * 912, 12 * 912)),
    ],
)
def test_hand_computed_bytes(precision: str, stage: int, expected: tuple[int, int, int]) -> None:
    got = model_states(query(n_params=1821, precision=Precision(precision), zero_stage=stage))
    assert (got.params_bytes, got.grads_bytes, got.optimizer_bytes) == expected
    assert got.cpu_offload_bytes == 0


def test_layout_element_counts() -> None:
    lay = deepspeed_layout(query(n_params=1821, zero_stage=2, gpus=2))
    assert (lay.aligned_elements, lay.partition_elements, lay.bucket_elements) == (1824, 912, 0)
    assert lay.weight_bytes == 4 and lay.optimizer_bytes_per_param == 12
    lay3 = deepspeed_layout(query(n_params=1821, zero_stage=3, gpus=2))
    assert (lay3.partition_elements, lay3.bucket_elements) == (911, 1856)


def test_sgd_and_eight_ranks() -> None:
    # Ψ = 10_000, N = 8, SGD with momentum (K = 4): A = ceil(10000/16)*16 = 10000, P = 1250
    got = model_states(query(n_params=10_000, gpus=8, zero_stage=1, optimizer=OptimizerName.SGD))
    assert got == ModelStates(4 * 10_000, 4 * 1250, (4 + 4) * 1250, 0)
    # sgd-nomomentum at stage 0 in fp32: no optimizer state at all
    none = model_states(query(n_params=10_000, optimizer=OptimizerName.SGD_NOMOMENTUM))
    assert none.optimizer_bytes == 0


def test_bucket_is_capped_at_deepspeeds_default() -> None:
    assert bucket_elements(100) == 128
    assert bucket_elements(7_000_000_000) == 500_000_000
    # a 7.5B model at stage 3 on 64 ranks: the 5e8-element bucket dominates the gradients
    got = model_states(
        query(n_params=7_500_000_000, gpus=64, zero_stage=3, precision=Precision.FP16)
    )
    p3 = -(-7_500_000_000 // 64)
    assert got.grads_bytes == 2 * p3 + 2 * 500_000_000
    assert got.optimizer_bytes == 12 * p3


def test_offload_moves_partitions_but_not_the_bucket() -> None:
    # stage 3, bf16, Ψ = 1821, N = 2: P3 = 911, B = 1856
    got = model_states(
        query(
            n_params=1821,
            precision=Precision.BF16,
            zero_stage=3,
            offload_optimizer=True,
            offload_params=True,
        )
    )
    assert got.params_bytes == 0
    assert got.grads_bytes == 2 * 1856
    assert got.optimizer_bytes == 0
    assert got.cpu_offload_bytes == 2 * 911 + 12 * 911 + 2 * 911
    # stage 2 optimizer offload: grad partition and optimizer column move to the host
    two = model_states(query(n_params=1821, zero_stage=2, offload_optimizer=True))
    assert (two.params_bytes, two.grads_bytes, two.optimizer_bytes) == (4 * 1824, 0, 0)
    assert two.cpu_offload_bytes == 4 * 912 + 12 * 912


def test_registered_and_paper_stays_the_default() -> None:
    assert ACCOUNTINGS["deepspeed"] == "workbench.estimate.deepspeed_layout:model_states"
    paper = estimate_memory(n_params=1820, zero_stage=2, gpus=2)
    ds = estimate_memory(n_params=1820, zero_stage=2, gpus=2, accounting="deepspeed")
    assert paper.accounting == "paper"
    assert paper.optimizer_bytes == 8 * 910  # the paper: K·Ψ/N in fp32
    assert ds.optimizer_bytes == 12 * 910  # DeepSpeed: (4 + K)·P
    assert ds.params_bytes == paper.params_bytes == 4 * 1820


@pytest.mark.parametrize(
    ("field", "value"), [("n_params", 0), ("gpus", 0), ("zero_stage", 4), ("n_params", 2.5)]
)
def test_bad_input_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field}="):
        deepspeed_layout(query(**{field: value}))


def test_estimate_memory_rejects_unknown_accounting() -> None:
    with pytest.raises(ValueError, match="accounting"):
        estimate_memory(n_params=10, accounting="zero-paper-v2")
