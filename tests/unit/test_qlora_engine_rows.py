"""QLoRA on an engine or precision it cannot train: one refusal from the engine rows
(`EngineRow.qlora`), naming the engine, what sent the setup there, and why."""

from __future__ import annotations

import pytest

from workbench import TrainConfig
from workbench.choices import Engine
from workbench.engines import (
    ENGINES,
    QLORA_NOT_DEEPSPEED,
    QLORA_NOT_PIPELINE,
    QLORA_NOT_TENSOR_PARALLEL,
    engine_problems,
    qlora_problems,
)


@pytest.mark.parametrize(
    ("settings", "world_size", "said", "why"),
    [
        ({"precision": "fp16"}, 1, "deepspeed (1 rank, `precision`=fp16", QLORA_NOT_DEEPSPEED),
        ({"precision": "bf16"}, 1, "deepspeed (1 rank, `precision`=bf16", QLORA_NOT_DEEPSPEED),
        ({"zero_stage": 2}, 1, "deepspeed (1 rank, `zero_stage`=2)", QLORA_NOT_DEEPSPEED),
        ({}, 2, "deepspeed (2 ranks)", QLORA_NOT_DEEPSPEED),
        ({"tp": 2}, 2, "tensor-parallel (2 ranks)", QLORA_NOT_TENSOR_PARALLEL),
        ({"pp": 2, "grad_accum": 2}, 2, "pipeline (2 ranks)", QLORA_NOT_PIPELINE),
    ],
)
def test_qlora_off_its_engines_names_the_engine_and_why(
    settings: dict[str, object], world_size: int, said: str, why: str
) -> None:
    config = TrainConfig(lora_rank=8, qlora=True, **settings)  # type: ignore[arg-type]
    found = [p for p in engine_problems(config, world_size) if p.field == "qlora"]
    assert len(found) == 1 and found[0].value is True
    assert said in found[0].message and found[0].message.endswith(why)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "amp-fp16", "bf16-true"])
def test_qlora_in_the_plain_loop_under_every_torch_precision(precision: str) -> None:
    config = TrainConfig(lora_rank=8, qlora=True, precision=precision)
    assert engine_problems(config, 1) == []


def test_each_row_says_whether_it_trains_qlora() -> None:
    assert ENGINES[Engine.PLAIN].qlora is None
    refusing = {e for e, row in ENGINES.items() if row.qlora is not None}
    assert {Engine.DEEPSPEED, Engine.TENSOR_PARALLEL, Engine.PIPELINE} <= refusing
    assert qlora_problems(TrainConfig(lora_rank=8), 2) == []  # LoRA alone: no QLoRA word


def test_fp32_adapters_under_deepspeeds_16_bit_mode_are_refused_by_name() -> None:
    from workbench.problems import ConfigError

    with pytest.raises(ConfigError, match=r"lora_dtype='fp32': .*DeepSpeed's 16-bit mode"):
        TrainConfig(lora_rank=8, lora_dtype="fp32", precision="fp16")
    assert TrainConfig(lora_rank=8, lora_dtype="fp32", precision="bf16-true").lora_dtype == "fp32"


def test_the_estimators_lora_dtype_and_qlora_bytes_are_checked_by_name() -> None:
    from workbench.estimate import estimate_memory
    from workbench.estimate.problems import EstimateInputError

    with pytest.raises(EstimateInputError) as info:
        estimate_memory(model="gpt2", lora_rank=4, lora_dtype="half", qlora_bytes=10)
    fields = {p.field: p.message for p in info.value.problems}
    assert fields["lora_dtype"] == "must be one of auto, fp32"
    assert "needs qlora=True" in fields["qlora_bytes"]
    with pytest.raises(EstimateInputError, match="lora_dtype='fp32': .*DeepSpeed's 16-bit"):
        estimate_memory(model="gpt2", lora_rank=4, lora_dtype="fp32", precision="bf16")
