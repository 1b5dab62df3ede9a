"""The step's records: `RecordMaker` builds, each step, the record the dataclass would."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.config import TrainConfig
from workbench.train.backends import ModelStateBytes, StepOutcome
from workbench.train.records import StepRecord
from workbench.train.step import RecordMaker, StepMeasure, make_record


def _arguments(**overrides):
    arguments = dict(
        step=3,
        config=TrainConfig(micro_batch=4, grad_accum=2, clip_grad_norm=1.0),
        measure=StepMeasure(
            2.5, StepOutcome(0.75, False, None, 1e-3), 0.5, 0.1, {"soft": 1.0, "hard": 4.0}
        ),
        world_size=2,
        rank=1,
        tokens_per_sample=64,
        memory=(10, 20, 30, None),
        state_bytes=ModelStateBytes(100, 200, 400),
        warmup=False,
        changes={"lr": 1e-3},
        zero_stage=0,
        cpu_util_percent=50.0,
    )
    arguments.update(overrides)
    return arguments


def _by_hand(a) -> dict:
    """The record's fields, worked out from the arguments one by one."""
    cfg, m = a["config"], a["measure"]
    samples = cfg.micro_batch * cfg.grad_accum * a["world_size"]
    sb = a["state_bytes"]
    return dict(
        step=a["step"],
        micro_steps=cfg.grad_accum,
        loss=m.loss,
        samples_per_s=samples / m.step_seconds,
        tokens_per_s=samples * a["tokens_per_sample"] / m.step_seconds
        if a["tokens_per_sample"]
        else None,
        step_seconds=m.step_seconds,
        data_seconds=m.data_seconds,
        compute_seconds=m.step_seconds - m.data_seconds,
        lr=m.outcome.lr,
        grad_norm=m.outcome.grad_norm,
        scale=m.outcome.scale,
        skipped=m.outcome.skipped,
        precision=str(cfg.precision),
        micro_batch=cfg.micro_batch,
        grad_accum=cfg.grad_accum,
        zero_stage=a["zero_stage"],
        fsdp=str(cfg.fsdp),
        world_size=a["world_size"],
        rank=a["rank"],
        clip_grad_norm=cfg.clip_grad_norm,
        activation_checkpointing=str(cfg.activation_checkpointing),
        num_workers=cfg.num_workers,
        changes=a["changes"],
        warmup=a["warmup"],
        params_bytes=sb.params_bytes if sb else None,
        grads_bytes=sb.grads_bytes if sb else None,
        optimizer_bytes=sb.optimizer_bytes if sb else None,
        cuda_allocated_bytes=a["memory"][0],
        cuda_max_allocated_bytes=a["memory"][1],
        cuda_reserved_bytes=a["memory"][2],
        rss_bytes=a["memory"][3],
        gpu_util_percent=None,
        gpu_memory_used_bytes=None,
        cpu_util_percent=a["cpu_util_percent"],
        loss_parts=m.loss_parts,
    )


def test_a_made_record_is_the_dataclass_built_field_by_field() -> None:
    a = _arguments()
    record = make_record(**a)
    expected = StepRecord(**_by_hand(a), wall_time=record.wall_time)
    assert record == expected
    assert record.to_dict() == expected.to_dict()
    assert StepRecord.from_dict(record.to_dict()) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.loss = 0.0  # type: ignore[misc]


def test_the_fixed_fields_follow_a_new_setting_and_new_state_bytes() -> None:
    maker = RecordMaker()
    first = maker.make(**_arguments())
    changed = _arguments(
        config=TrainConfig(micro_batch=8, precision="amp-bf16"),
        state_bytes=None,
        tokens_per_sample=None,
        zero_stage=2,
        step=4,
    )
    second = maker.make(**changed)
    assert second == StepRecord(**_by_hand(changed), wall_time=second.wall_time)
    assert (first.micro_batch, second.micro_batch) == (4, 8)
    assert second.precision == "amp-bf16" and second.zero_stage == 2
    assert second.params_bytes is None and second.tokens_per_s is None
    again = maker.make(**_arguments(step=5))  # back to the first setting
    assert again == StepRecord(**_by_hand(_arguments(step=5)), wall_time=again.wall_time)


def test_a_record_of_a_skipped_step_has_no_rates() -> None:
    a = _arguments(measure=StepMeasure(float("nan"), StepOutcome(None, True, None, 1e-3), 0.0, 0.0))
    record = make_record(**a)
    assert record.samples_per_s == 0.0 and record.tokens_per_s is None and record.skipped


def test_from_fields_names_missing_and_unknown_fields() -> None:
    fields = make_record(**_arguments()).to_dict()
    del fields["loss"]
    fields["lossy"] = 1.0
    with pytest.raises(ValueError, match=r"missing \['loss'\], unknown \['lossy'\]"):
        StepRecord.from_fields(fields)


def test_an_earlier_records_true_or_false_recomputation_reads_as_full_or_none() -> None:
    """Records written before recomputation had three modes (a run's log, a checkpoint's
    history) held `activation_checkpointing` True or False: read as "full" and "none";
    any other value that is no mode's text is still refused by name."""
    from workbench.train.records import StepRecord

    base = make_record(**_arguments()).to_dict()
    assert (
        StepRecord.from_dict({**base, "activation_checkpointing": True}).activation_checkpointing
        == "full"
    )
    assert (
        StepRecord.from_dict({**base, "activation_checkpointing": False}).activation_checkpointing
        == "none"
    )
    with pytest.raises(ValueError, match="record field activation_checkpointing=3: must be str"):
        StepRecord.from_dict({**base, "activation_checkpointing": 3})
