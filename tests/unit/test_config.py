"""TrainConfig: validation reports every problem at once, names field, value and choices."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.config import (
    SESSION_OPTIMIZERS,
    OffloadDevice,
    OptimizerName,
    Precision,
    TrainConfig,
    runtime_problems,
)


def test_defaults_are_valid_and_enums_coerced():
    cfg = TrainConfig(precision="AMP-BF16", optimizer="sgd", lr_schedule="cosine")
    assert cfg.precision is Precision.AMP_BF16
    assert cfg.precision == "amp-bf16"  # str enum compares equal to its value
    assert cfg.problems() == []
    cfg.validate()


def test_every_problem_reported_at_once():
    with pytest.raises(ValueError) as info:
        TrainConfig(micro_batch=0, precision="fp8", lr=float("nan"), zero_stage=5, num_workers=-1)
    text = str(info.value)
    assert text.startswith("5 invalid settings")
    assert "micro_batch=0: must be an integer >= 1" in text
    allowed = "must be one of fp32, amp-fp16, amp-bf16, fp16, bf16, bf16-true"
    assert f"  - precision='fp8': {allowed}" in text.splitlines()
    assert "lr=nan: must be a finite number > 0" in text
    assert "zero_stage=5: must be 0, 1, 2 or 3" in text
    assert "num_workers=-1" in text


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"micro_batch": "8"}, r"micro_batch='8': must be an integer >= 1"),
        ({"grad_accum": True}, r"grad_accum=True: must be an integer"),
        ({"clip_grad_norm": -1.0}, r"clip_grad_norm=-1.0: must be a finite number > 0 or None"),
        ({"momentum": 1.5}, r"momentum=1.5: .*>= 0 and < 1"),
        ({"momentum": 1.0}, r"momentum=1.0: .*>= 0 and < 1"),
        ({"optimizer": "adam8bit", "zero_stage": 1}, r"adam8bit.*trains in the plain loop"),
        ({"offload_optimizer": "cpu"}, r"offload_optimizer='cpu': needs zero_stage 1, 2 or 3"),
        ({"offload_params": "cpu", "zero_stage": 2}, r"offload_params='cpu'.*zero_stage=3"),
        ({"offload_optimizer": "nvme", "zero_stage": 2}, r"nvme_path=None: NVMe offload needs"),
        (
            {"optimizer": "onebitadam", "zero_stage": 1},
            r"optimizer='onebitadam': DeepSpeed's 1-bit optimizers do not run with ZeRO; "
            r"needs zero_stage=0 \(zero_stage=1\)",
        ),
        ({"loss_scale_growth": 1.0}, r"loss_scale_growth=1.0: must be a finite number > 1"),
        (
            {"loss_scale_backoff": 1.0},
            r"loss_scale_backoff=1.0: must be a finite number > 0 and < 1",
        ),
        ({"warmup_steps": 50, "total_steps": 10}, r"warmup_steps=50: must not exceed"),
        (
            {"activation_checkpointing": "yes"},
            r"activation_checkpointing='yes': must be one of none, selective, full \(or True: "
            r"full, False: none\)",
        ),
    ],
)
def test_bad_values_name_field_value_and_allowed(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**changes)


def test_nvme_with_writable_dir_is_accepted(tmp_path):
    cfg = TrainConfig(zero_stage=3, offload_params="nvme", nvme_path=str(tmp_path))
    assert cfg.offload_params is OffloadDevice.NVME
    assert cfg.uses_deepspeed
    assert runtime_problems(cfg) == []


def test_a_job_for_another_machine_is_valid_and_runtime_problems_say_what_cannot_run_here(
    tmp_path,
):
    """A config is a job (it may be exported to a cluster); what a Session here cannot run
    of it is `runtime_problems`: a missing NVMe directory, an optimizer it does not train."""
    missing = str(tmp_path / "not-here")
    cfg = TrainConfig(zero_stage=3, offload_params="nvme", nvme_path=missing, optimizer="lamb")
    assert cfg.problems() == []
    lamb, nvme = runtime_problems(cfg)
    assert (lamb.field, lamb.value) == ("optimizer", "lamb")
    assert str(lamb).startswith(
        "optimizer='lamb': cannot train here: DeepSpeed's Lamb is FusedLamb"
    )
    assert "the nearest a Session trains is optimizer='adamw'" in str(lamb)
    assert (nvme.field, nvme.value) == ("nvme_path", missing)
    assert nvme.message == "must be an existing writable directory on this machine"
    assert (
        str(nvme)
        == f"nvme_path={missing!r}: must be an existing writable directory on this machine"
    )
    assert runtime_problems(TrainConfig()) == []


@pytest.mark.parametrize(
    ("optimizer", "nearest"),
    [
        ("lamb", "adamw"),
        ("lion", "adamw"),
        ("adagrad", "adam"),
        ("onebitadam", "adamw"),
        ("zerooneadam", "adamw"),
        ("onebitlamb", "adamw"),
    ],
)
def test_every_optimizer_a_session_cannot_train_names_the_nearest(optimizer, nearest):
    cfg = TrainConfig(optimizer=optimizer)
    (problem,) = runtime_problems(cfg)
    assert (problem.field, problem.value) == ("optimizer", optimizer)
    line = str(problem)
    assert line.startswith(f"optimizer={optimizer!r}: cannot train here: ")
    assert f"the nearest a Session trains is optimizer={nearest!r}" in line
    assert runtime_problems(TrainConfig(optimizer=nearest)) == []
    assert OptimizerName(nearest) in SESSION_OPTIMIZERS


@pytest.mark.parametrize(
    ("changes", "suggestion"),
    [
        ({"precision": "bf16-mixed"}, "precision='bf16-mixed': .*; did you mean 'amp-bf16'\\?"),
        ({"precision": "16-mixed"}, "precision='16-mixed': .*; did you mean 'amp-fp16'\\?"),
        ({"precision": "bf16_true"}, "precision='bf16_true': .*; did you mean 'bf16-true'\\?"),
        ({"precision": "pure_bf16"}, "did you mean 'bf16-true'\\?"),
        ({"precision": "32"}, "did you mean 'fp32'\\?"),
        ({"precision": "amp_bf16"}, "did you mean 'amp-bf16'\\?"),
        ({"optimizer": "adamw_torch"}, "did you mean 'adamw'\\?"),
        ({"optimizer": "paged_adamw_8bit"}, "did you mean 'paged-adam8bit'\\?"),
        ({"optimizer": "sgd_nomomentum"}, "did you mean 'sgd-nomomentum'\\?"),
        ({"lr_schedule": "cosin"}, "did you mean 'cosine'\\?"),
        ({"lr_schedule": "constant_with_warmup"}, "did you mean 'constant'\\?"),
        ({"device": "gpu"}, "did you mean 'cuda'\\?"),
        ({"offload_optimizer": "disk", "zero_stage": 1}, "did you mean 'nvme'\\?"),
    ],
)
def test_unknown_choices_suggest_the_close_one(changes, suggestion):
    with pytest.raises(ValueError, match=suggestion):
        TrainConfig(**changes)


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(ValueError) as info:
        TrainConfig(precision="int4")
    assert str(info.value) == (
        "invalid setting: precision='int4': must be one of fp32, amp-fp16, amp-bf16, fp16, bf16, "
        "bf16-true"
    )


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("accumulate_grad_batches", "grad_accum"),  # Lightning
        ("gradient_clip_val", "clip_grad_norm"),  # Lightning
        ("gradient_accumulation_steps", "grad_accum"),  # Hugging Face, DeepSpeed
        ("per_device_train_batch_size", "micro_batch"),  # Hugging Face
        ("learning_rate", "lr"),
        ("max_grad_norm", "clip_grad_norm"),
        ("gradient_checkpointing", "activation_checkpointing"),
        ("grad_acum", "grad_accum"),  # a typo
        ("warmup", "warmup_steps"),
    ],
)
def test_unknown_setting_names_suggest_the_field_everywhere(name, field):
    pattern = rf"{name}=4: unknown setting; did you mean {field!r}\? known settings: "
    with pytest.raises(ValueError, match=pattern):
        TrainConfig(**{name: 4})
    with pytest.raises(ValueError, match=pattern):
        TrainConfig().replace(**{name: 4})
    with pytest.raises(ValueError, match=pattern):
        TrainConfig.from_dict({name: 4})


def test_several_unknown_names_are_reported_together():
    with pytest.raises(ValueError) as info:
        TrainConfig(accumulate_grad_batches=4, learning_rate=1e-3)
    text = str(info.value)
    assert text.startswith("2 invalid settings:")
    assert "did you mean 'grad_accum'?" in text and "did you mean 'lr'?" in text


def test_replace_validates_and_rejects_unknown_names():
    cfg = TrainConfig()
    assert cfg.replace(grad_accum=4).grad_accum == 4
    assert cfg.grad_accum == 1  # frozen: original untouched
    with pytest.raises(
        ValueError, match=r"grad_acum=4: unknown setting; did you mean 'grad_accum'\? known"
    ):
        cfg.replace(grad_acum=4)
    with pytest.raises(ValueError, match=r"grad_accum=0"):
        cfg.replace(grad_accum=0)


def test_effective_batch_size_is_a_method_of_world_size():
    cfg = TrainConfig(micro_batch=8, grad_accum=4)
    assert cfg.effective_batch_size() == 32
    assert cfg.effective_batch_size(world_size=8) == 256
    with pytest.raises(ValueError, match=r"world_size=0: must be an integer >= 1"):
        cfg.effective_batch_size(0)


def test_uses_deepspeed():
    assert not TrainConfig().uses_deepspeed
    assert not TrainConfig(precision="amp-fp16").uses_deepspeed
    assert TrainConfig(precision="bf16").uses_deepspeed
    assert TrainConfig(zero_stage=1).uses_deepspeed


def test_dict_round_trip():
    cfg = TrainConfig(precision="amp-bf16", grad_accum=4, clip_grad_norm=1.0, seed=3)
    data = cfg.to_dict()
    assert data["precision"] == "amp-bf16"
    assert TrainConfig.from_dict(data) == cfg
    with pytest.raises(ValueError, match="bogus=1: unknown setting"):
        TrainConfig.from_dict({**data, "bogus": 1})


@given(
    micro=st.one_of(st.integers(-5, 64), st.floats(allow_nan=True), st.text(max_size=3)),
    lr=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 2)),
)
def test_random_inputs_either_construct_or_raise_value_error(micro, lr):
    try:
        cfg = TrainConfig(micro_batch=micro, lr=lr)
    except ValueError as exc:  # each line of the refusal names the field at fault
        for line in str(exc).splitlines()[1:] or [str(exc)]:
            assert "micro_batch=" in line or "lr=" in line, line
    else:
        assert isinstance(cfg.micro_batch, int) and cfg.micro_batch >= 1
        assert math.isfinite(cfg.lr) and cfg.lr > 0


def test_the_docstring_lists_every_setting_and_every_allowed_value() -> None:
    import dataclasses

    from workbench.config import ENUM_FIELDS

    doc = TrainConfig.__doc__ or ""
    for f in dataclasses.fields(TrainConfig):
        assert f.name in doc, f.name
    for name, enum in ENUM_FIELDS.items():
        for value in enum:
            assert f'"{value.value}"' in doc, (name, value.value)


@pytest.mark.parametrize(
    ("changes", "world_size", "engine"),
    [
        ({}, 1, "plain"),
        ({"precision": "amp-bf16"}, 1, "plain"),
        ({}, 2, "deepspeed"),  # a Session's data parallelism is DeepSpeed's ZeRO-0
        ({"zero_stage": 1}, 1, "deepspeed"),
        ({"precision": "bf16"}, 1, "deepspeed"),
        ({"fsdp": "full_shard"}, 1, "fsdp"),
        ({"fsdp": "no_shard"}, 4, "fsdp"),
        ({"precision": "bf16-true"}, 1, "plain"),  # pure bf16 is not DeepSpeed's bf16
        ({"precision": "bf16-true", "fsdp": "shard_grad_op"}, 2, "fsdp"),
    ],
)
def test_one_engine_decision(changes, world_size, engine) -> None:
    from workbench.config import Engine
    from workbench.engines import engine_for

    got = engine_for(TrainConfig(**changes), world_size)
    assert got is Engine(engine)
    assert got.copies_model is (engine != "plain")


def test_every_engine_has_a_backend_and_an_accounting() -> None:
    from workbench.config import Engine
    from workbench.prediction import ACCOUNTING
    from workbench.train.backends import BACKENDS

    assert set(BACKENDS) == set(Engine) == set(ACCOUNTING)


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2"])
def test_engine_for_names_a_bad_world_size(world_size) -> None:
    from workbench.engines import engine_for

    with pytest.raises(ValueError, match=r"world_size=.*: must be an integer >= 1"):
        engine_for(TrainConfig(), world_size)


@pytest.mark.parametrize("fsdp", ["off", "full_shard", "shard_grad_op", "no_shard"])
def test_pure_bf16_runs_on_the_plain_loop_and_fsdp(fsdp) -> None:
    from workbench.engines import engine_problems

    cfg = TrainConfig(precision="bf16-true", fsdp=fsdp)
    assert cfg.precision is Precision.BF16_TRUE and not cfg.uses_deepspeed
    assert cfg.problems() == []
    assert engine_problems(cfg, 1) == []
    assert engine_problems(cfg, 1 if fsdp == "off" else 4) == []


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_pure_bf16_with_zero_is_refused_naming_the_field_and_what_to_use(stage) -> None:
    with pytest.raises(ValueError) as info:
        TrainConfig(precision="bf16-true", zero_stage=stage)
    (problem,) = info.value.problems  # type: ignore[attr-defined]
    assert (problem.field, problem.value) == ("precision", "bf16-true")
    assert str(info.value) == (
        f"invalid setting: precision='bf16-true': pure bf16 has no fp32 master copy of the "
        f"weights and DeepSpeed (zero_stage={stage}) always keeps one: use 'bf16' (DeepSpeed's "
        "bf16 with an fp32 master copy), or pure bf16 with fsdp (full_shard, shard_grad_op "
        "or no_shard) and zero_stage=0"
    )
    assert TrainConfig(precision="bf16", zero_stage=stage).uses_deepspeed  # the alternative


def test_pure_bf16_on_several_ranks_without_fsdp_is_an_engine_problem() -> None:
    """Several ranks without FSDP train through DeepSpeed (`engine_for`): the config is
    valid, the engine it meets on 2 ranks cannot train it."""
    from workbench.engines import engine_problems

    cfg = TrainConfig(precision="bf16-true")
    (problem,) = engine_problems(cfg, 2)
    assert (problem.field, problem.value) == ("precision", "bf16-true")
    assert "DeepSpeed (2 ranks without `fsdp` train through it)" in problem.message
    assert "use 'bf16'" in problem.message and "`fsdp`" in problem.message
    assert engine_problems(TrainConfig(precision="bf16"), 2) == []
    assert engine_problems(TrainConfig(precision="bf16-true", fsdp="no_shard"), 2) == []


def test_lightning_precision_names_map_to_the_workbench_ones() -> None:
    from workbench.config import VALUE_ALIASES

    aliases = VALUE_ALIASES["precision"]
    assert aliases["bf16-mixed"] == "amp-bf16"  # autocast, fp32 weights
    assert "bf16-true" not in aliases  # a choice of its own: pure bf16
    assert aliases["bf16_true"] == aliases["pure_bf16"] == "bf16-true"
    assert TrainConfig(precision="BF16-TRUE").precision is Precision.BF16_TRUE
    for value in aliases.values():
        assert value in Precision.choices(), value
