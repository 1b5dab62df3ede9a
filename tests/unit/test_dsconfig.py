"""TrainConfig <-> DeepSpeed JSON: export, and import by DeepSpeed's own rule.

The import checks with DeepSpeed's code (`workbench.deepspeed.check`): expected messages name the
installed DeepSpeed through `deepspeed_name()` rather than a hard-coded version.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import pytest
from samples import CONFIGS, SAMPLE

from workbench.config import OptimizerName, TrainConfig
from workbench.deepspeed import (
    ZERO_TESTED_OPTIMIZERS,
    from_deepspeed,
    import_deepspeed,
    to_deepspeed,
)
from workbench.deepspeed import check as ds_check

DS = ds_check.deepspeed_name()

#: The optimizers DeepSpeed offers besides Adam/AdamW/SGD, as TrainConfigs that export.
DEEPSPEED_OPTIMIZER_CONFIGS = [
    TrainConfig(optimizer="lamb", precision="fp16", zero_stage=1, lr=1e-3, weight_decay=0.01),
    TrainConfig(optimizer="lion", zero_stage=2, offload_optimizer="cpu", lr=1e-4),
    TrainConfig(optimizer="adagrad", zero_stage=1, lr=1e-2, weight_decay=0.0),
    TrainConfig(optimizer="adagrad", zero_stage=2, offload_optimizer="cpu", precision="bf16"),
    TrainConfig(optimizer="sgd", momentum=0.8, zero_stage=3, micro_batch=2, lr_schedule="cosine"),
    TrainConfig(optimizer="onebitadam", precision="fp16", grad_accum=2),
    TrainConfig(optimizer="zerooneadam", precision="fp16"),
    TrainConfig(optimizer="onebitlamb", precision="fp16", clip_grad_norm=1.0),
]


def test_module_is_pure() -> None:
    code = "import sys, workbench.deepspeed; print('torch' in sys.modules or 'deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("config", CONFIGS + DEEPSPEED_OPTIMIZER_CONFIGS)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_round_trip_is_identical(config: TrainConfig, world: int) -> None:
    exported = to_deepspeed(config, world_size=world)
    assert exported["train_batch_size"] == config.micro_batch * config.grad_accum * world
    result = import_deepspeed(json.loads(json.dumps(exported)))
    assert result.world_size == world
    if config.lr_schedule == "onecycle" and config.warmup_steps == 0:
        # one-cycle without warmup rises over 30% of the horizon, which DeepSpeed spells out
        assert result.config.warmup_steps == round(0.3 * config.total_steps)
        assert result.config.replace(warmup_steps=0) == config
    else:
        assert result.config == config
    again = to_deepspeed(result.config, world_size=result.world_size)
    assert again == exported
    onebit = OptimizerName(config.optimizer).is_onebit and not ds_check.onebit_available()
    assert len(result.warnings) == (1 if onebit else 0), result.warnings


@pytest.mark.parametrize("config", CONFIGS + DEEPSPEED_OPTIMIZER_CONFIGS)
def test_export_is_a_config_deepspeed_accepts(config: TrainConfig) -> None:
    """DeepSpeed's own checks (its config parser, the optimizer and scheduler it would
    build, the ZeRO optimizer rule) find nothing in an exported config; building an
    engine from exports is tests/integration/test_deepspeed_optimizers.py."""
    ds = to_deepspeed(config, world_size=2)
    assert ds_check.config_problems(ds, batch_keys=("train_batch_size",)) == []
    opt = ds["optimizer"]
    if OptimizerName(config.optimizer).is_onebit and not ds_check.onebit_available():
        _assert_a_missing_onebit_optimizer_is_reported(config, ds)
    else:
        assert (
            ds_check.optimizer_problems(
                opt["type"],
                opt["params"],
                zero_stage=config.zero_stage,
                offload=config.offload_optimizer != "none",
                allow_untested=ds.get("zero_allow_untested_optimizer", False),
            )
            == []
        )
    if "scheduler" in ds:
        assert ds_check.scheduler_problems(ds["scheduler"]["type"], ds["scheduler"]["params"]) == []


def _assert_a_missing_onebit_optimizer_is_reported(config: TrainConfig, ds: dict) -> None:
    """A DeepSpeed without the 1-bit optimizers builds no class for the exported type (its
    `deepspeed.initialize` would fail); the import says so, naming the type and the
    installed DeepSpeed, and a Session refuses the optimizer with the nearest it trains."""
    from workbench import Session
    from workbench.config import runtime_problems

    kind = ds["optimizer"]["type"]
    assert ds_check.optimizer_class(kind, offload=False) == (None, set())
    assert kind.lower() not in ds_check.deepspeed_optimizer_types()
    (note,) = import_deepspeed(json.loads(json.dumps(ds))).warnings
    assert note.startswith(f"optimizer.type={kind!r}: {DS} (installed) has no 1-bit optimizers")
    assert "a Session refuses it (nearest: adamw)" in note
    (problem,) = runtime_problems(config)
    assert (problem.field, problem.value) == ("optimizer", config.optimizer)
    assert "cannot train here" in str(problem) and "optimizer='adamw'" in str(problem)
    with pytest.raises(ValueError, match=re.escape(str(problem))):
        Session(config, model="tiny-gpt", model_options={"layers": 1, "hidden": 16, "heads": 2})


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "adagrad", "lamb", "lion"])
@pytest.mark.parametrize("offload", [False, True])
def test_zero_tested_optimizers_are_deepspeeds_list(optimizer: str, offload: bool) -> None:
    kind = to_deepspeed(TrainConfig(optimizer=optimizer))["optimizer"]["type"]
    assert (OptimizerName(optimizer) in ZERO_TESTED_OPTIMIZERS) == ds_check.zero_tested(
        kind, offload=offload
    )


def test_untested_zero_optimizer_gets_deepspeeds_flag() -> None:
    assert "zero_allow_untested_optimizer" not in to_deepspeed(TrainConfig(zero_stage=2))
    assert to_deepspeed(TrainConfig(optimizer="sgd", zero_stage=1))["zero_allow_untested_optimizer"]
    assert "zero_allow_untested_optimizer" not in to_deepspeed(TrainConfig(optimizer="sgd"))
    with pytest.raises(ValueError, match=r"SGD is an untested ZeRO optimizer"):
        import_deepspeed(
            {
                "train_micro_batch_size_per_gpu": 1,
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                "zero_optimization": {"stage": 1},
            }
        )


def test_fields_map_back() -> None:
    config = CONFIGS[1]
    back = import_deepspeed(to_deepspeed(config, 2)).config
    for name in (
        "precision",
        "zero_stage",
        "grad_accum",
        "micro_batch",
        "lr",
        "lr_schedule",
        "warmup_steps",
        "total_steps",
        "clip_grad_norm",
        "loss_scale_init",
        "loss_scale_interval",
        "optimizer",
        "weight_decay",
    ):
        assert getattr(back, name) == getattr(config, name), name


def test_exported_blocks() -> None:
    ds = to_deepspeed(CONFIGS[1], world_size=2)
    assert ds["fp16"] == {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 12,
        "loss_scale_window": 500,
        "hysteresis": 1,
        "min_loss_scale": 1,
    }
    assert ds["gradient_clipping"] == 1.0
    assert ds["scheduler"]["type"] == "WarmupCosineLR"
    adam = to_deepspeed(CONFIGS[2])["optimizer"]
    assert adam["type"] == "Adam" and adam["params"]["adam_w_mode"] is False
    zero = to_deepspeed(CONFIGS[2])["zero_optimization"]
    assert zero == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }
    assert to_deepspeed(DEEPSPEED_OPTIMIZER_CONFIGS[0])["optimizer"] == {
        "type": "Lamb",
        "params": {"lr": 1e-3, "weight_decay": 0.01},
    }


# ----------------------------------------------------------------------------- warnings
def test_sample_config_imports_with_one_grouped_warning() -> None:
    result = import_deepspeed(SAMPLE)
    c = result.config
    assert (c.micro_batch, c.grad_accum, result.world_size) == (128, 8, 1)
    assert (c.precision.value, c.zero_stage, c.lr, c.weight_decay) == ("fp16", 3, 6e-5, 0.01)
    assert (c.offload_optimizer.value, c.offload_params.value, c.nvme_path) == ("cpu", "cpu", None)
    assert c.loss_scale_interval == 1000  # DeepSpeed's loss_scale_window default
    text, buffers = result.warnings
    assert text.startswith("not modelled by the workbench, ignored (5): steps_per_print; ")
    # DeepSpeed's buffer sizes: an estimate reads them, the session's engine sizes its own
    assert buffers == (
        "read by `workbench estimate --deepspeed-config` (its DeepSpeed buffer terms), not "
        "set in the session, whose engine sizes its own (1): zero_optimization.overlap_comm"
    )
    for entry in (
        "zero_optimization.contiguous_gradients",
        "zero_optimization.offload_optimizer.nvme_path='/mnt/nvme' (ignored while device is 'cpu')",
        "zero_optimization.offload_param.nvme_path='/mnt/nvme' (ignored while device is 'cpu')",
        "fp16.hysteresis=2 (DeepSpeed's default, the workbench backs off on every overflow, "
        "hysteresis 1)",
    ):
        assert entry in text
    # world size given: micro is solved for it
    assert import_deepspeed(SAMPLE, world_size=4).config.micro_batch == 32
    with pytest.warns(UserWarning, match=r"ignored \(5\): steps_per_print") as caught:
        config = from_deepspeed(SAMPLE)
    assert len(caught) == 2
    assert config == c


def test_keys_deepspeed_does_not_read_are_named_with_the_close_one() -> None:
    result = import_deepspeed(
        {"train_micro_batch_size_per_gpu": 4, "steps_per_prnt": 10, "foo": 1, "wandb": {}}
    )
    (text,) = result.warnings
    assert text == (
        "not modelled by the workbench, ignored (1): wandb. "
        f"not read by {DS} either, ignored (2): steps_per_prnt (did you mean 'steps_per_print'?); "
        "foo"
    )


def test_values_deepspeed_accepts_but_the_workbench_approximates_are_named() -> None:
    ds = {
        "train_micro_batch_size_per_gpu": 4,
        "fp16": {"enabled": True, "loss_scale": 128, "hysteresis": 1},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-6, "bias_correction": True},
        },
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-4, "warmup_num_steps": 5}},
        "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
    }
    result = import_deepspeed(ds)
    c = result.config
    assert (c.precision, c.zero_stage, c.offload_params, c.warmup_steps) == ("fp16", 2, "none", 5)
    (text,) = result.warnings
    assert text == (
        "not modelled by the workbench, ignored (5): "
        "zero_optimization.offload_param (DeepSpeed offloads parameters at stage 3 only, not 2); "
        "fp16.loss_scale=128 (static loss scaling, the workbench scales dynamically); "
        "optimizer.params.betas=[0.9, 0.95] (the workbench uses [0.9, 0.999]); "
        "optimizer.params.eps=1e-06 (the workbench uses 1e-08); "
        "scheduler.params.warmup_type='log' (DeepSpeed's default, the workbench warms up linearly)"
    )  # bias_correction=True is FusedAdam's default: nothing to say about it


def test_schedulers_deepspeed_has_and_the_workbench_approximates() -> None:
    base = {"train_micro_batch_size_per_gpu": 4}
    cosine = import_deepspeed(
        {**base, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 500}}}
    )
    # DeepSpeed's defaults: 1000 warmup steps (clamped to the horizon), log warmup, cos_min 1e-4
    assert (cosine.config.lr_schedule, cosine.config.total_steps) == ("cosine", 500)
    assert cosine.config.warmup_steps == 500
    (text,) = cosine.warnings
    assert "warmup_num_steps=1000 (more than total_num_steps, uses 500)" in text
    assert "cos_min_ratio=0.0001 (DeepSpeed's default, the workbench decays to 0)" in text
    decay = import_deepspeed(
        {
            **base,
            "scheduler": {
                "type": "WarmupDecayLR",
                "params": {"total_num_steps": 900, "warmup_num_steps": 90, "warmup_type": "linear"},
            },
        }
    )
    assert (decay.config.lr_schedule, decay.config.warmup_steps) == ("cosine", 90)
    assert "imported as lr_schedule='cosine' over the same steps" in decay.warnings[0]
    cycle = import_deepspeed(
        {
            **base,
            "scheduler": {
                "type": "OneCycle",
                "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3},
            },
        }
    )
    assert (cycle.config.lr_schedule, cycle.config.lr, cycle.config.warmup_steps) == (
        "onecycle",
        1e-3,
        2000,
    )
    assert (
        "cycle_momentum=True (DeepSpeed's default, the workbench does not cycle momentum)"
        in (cycle.warnings[0])
    )
    rng = import_deepspeed({**base, "scheduler": {"type": "LRRangeTest"}})
    assert rng.config.lr_schedule == "constant"
    assert "scheduler.type='LRRangeTest' (not modelled" in rng.warnings[0]


# ----------------------------------------------------------------------------- "auto"
HF_AUTO = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "overlap_comm": True},
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}


def test_auto_values_are_filled_from_the_sessions_settings_with_a_note() -> None:
    base = TrainConfig(
        micro_batch=4,
        grad_accum=2,
        lr=2e-5,
        weight_decay=0.1,
        precision="bf16",
        clip_grad_norm=1.0,
        warmup_steps=10,
        seed=7,
    )
    result = import_deepspeed(HF_AUTO, base=base, world_size=4)
    c = result.config
    assert (c.micro_batch, c.grad_accum, result.world_size) == (4, 2, 4)
    assert (c.lr, c.weight_decay, c.clip_grad_norm, c.precision) == (2e-5, 0.1, 1.0, "bf16")
    assert (c.lr_schedule, c.warmup_steps, c.zero_stage, c.seed) == ("constant", 10, 2, 7)
    auto, ignored, buffers = result.warnings
    assert auto == (
        '"auto" values filled from the session\'s settings: fp16.enabled=False (precision); '
        "bf16.enabled=True (precision); optimizer.params.lr=2e-05 (lr); "
        "optimizer.params.betas=[0.9, 0.999] (the workbench's betas); "
        "optimizer.params.eps=1e-08 (the workbench's eps); "
        "optimizer.params.weight_decay=0.1 (weight_decay); "
        "scheduler.params.warmup_min_lr=0.0 (the workbench warms up from 0); "
        "scheduler.params.warmup_max_lr=2e-05 (lr); scheduler.params.warmup_num_steps=10 "
        "(warmup_steps); gradient_accumulation_steps=2 (grad_accum); "
        "gradient_clipping=1.0 (clip_grad_norm); "
        "train_batch_size (micro_batch x grad_accum x world size); "
        "train_micro_batch_size_per_gpu=4 (micro_batch); "
        "and left to DeepSpeed's defaults: zero_optimization.reduce_bucket_size"
    )
    assert ignored.startswith("not modelled by the workbench, ignored (1): ")
    assert buffers.endswith("sizes its own (1): zero_optimization.overlap_comm")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert from_deepspeed(HF_AUTO, base=base, world_size=4) == c
    assert [str(w.message) for w in caught] == [auto, ignored, buffers]
    assert {w.filename for w in caught} == {__file__}  # pointing at the caller's line
    # the defaults fill them when no session is given, and every precision works
    plain = from_deepspeed_quiet(HF_AUTO)
    assert (plain.micro_batch, plain.precision, plain.clip_grad_norm) == (8, "fp32", None)
    amp = import_deepspeed(HF_AUTO, base=TrainConfig(precision="amp-bf16")).config
    assert amp.precision == "amp-bf16"


def test_auto_precision_from_a_pure_bf16_session_is_deepspeeds_bf16() -> None:
    """DeepSpeed has no pure bf16 (it keeps an fp32 master copy): a session in bf16-true
    fills "auto" with DeepSpeed's bf16, and the note says why."""
    base = TrainConfig(precision="bf16-true")
    result = import_deepspeed(HF_AUTO, base=base, world_size=4)
    assert result.config.precision == "bf16" and result.config.zero_stage == 2
    why = "(precision='bf16-true', whose nearest in DeepSpeed is bf16)"
    assert f"fp16.enabled=False {why}; bf16.enabled=True {why}" in result.warnings[0]
    only_fp16 = {"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": "auto"}}
    result = import_deepspeed({**only_fp16, "zero_optimization": {"stage": 3}}, base=base)
    assert result.config.precision == "bf16" and f"precision='bf16' {why}" in result.warnings[0]
    explicit = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}}
    assert import_deepspeed(explicit, base=base).config.precision == "bf16"


def test_settings_deepspeed_cannot_hold_are_refused_not_dropped() -> None:
    """A plain-loop setting with no DeepSpeed key (the optimizer stepped inside backward,
    QLoRA's 4-bit base) is an error naming it, as `workbench export` refuses it, rather
    than a config that silently trains without it."""
    for settings in ({"optimizer_in_backward": True}, {"qlora": True, "lora_rank": 8}):
        name = next(iter(settings))
        with pytest.raises(ValueError, match=rf"{name}=True: .*Session's plain loop trains it"):
            to_deepspeed(TrainConfig(**settings))
    assert to_deepspeed(TrainConfig(lora_rank=8))["train_micro_batch_size_per_gpu"] == 8


def from_deepspeed_quiet(ds: dict) -> TrainConfig:  # type: ignore[type-arg]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_deepspeed(ds)


def test_auto_at_the_top_level_without_a_session_setting_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"steps_per_print='auto': no session setting fills it"):
        import_deepspeed({"train_micro_batch_size_per_gpu": 1, "steps_per_print": "auto"})


# ----------------------------------------------------------------------------- errors
def test_reads_json_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(to_deepspeed(CONFIGS[1], 2)))
    assert (
        import_deepspeed(str(path)).config == import_deepspeed(to_deepspeed(CONFIGS[1], 2)).config
    )
    with pytest.raises(ValueError, match="missing.json': no such file"):
        import_deepspeed(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        import_deepspeed(str(tmp_path / "bad.json"))


# ----------------------------------------------------------------------------- careless input
def test_a_directory_or_a_fifo_is_refused_without_reading(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"DeepSpeed config '.*': a directory, not a regular file"):
        from_deepspeed(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would block until a writer comes
    with pytest.raises(ValueError, match=r"a FIFO \(named pipe\), not a regular file"):
        from_deepspeed(str(fifo))
    with pytest.raises(ValueError, match=r"a device, not a regular file"):
        import_deepspeed("/dev/zero")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"must hold a JSON object, not list"):
        import_deepspeed(tmp_path / "list.json")
    with pytest.raises(ValueError, match=r"source=3: must be a dict or a path"):
        import_deepspeed(3)  # type: ignore[arg-type]


def test_a_key_given_twice_is_refused_not_the_last_one_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "dup.json"
    path.write_text(
        '{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1, "stage": 3}}'
    )
    with pytest.raises(ValueError, match=r"key 'stage' appears twice in one object"):
        import_deepspeed(path)


def test_a_config_nested_200000_levels_deep_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "deep.json"
    path.write_text('{"a": ' * 200_000 + "1" + "}" * 200_000)
    with pytest.raises(ValueError, match=r"nested deeper than 32 levels"):
        import_deepspeed(path)
    deep: dict[str, object] = {"x": 1}
    for _ in range(100_000):
        deep = {"x": deep}
    with pytest.raises(ValueError, match=r"x\.x\.x.*: nested deeper than 32 levels"):
        import_deepspeed({"train_micro_batch_size_per_gpu": 1, "wall_clock_breakdown": deep})


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {"fp16": {"enabled": "false"}},
            "fp16.enabled='false': a string where DeepSpeed expects true or false; write false "
            "without quotes",
        ),
        (
            {"torch_autocast": {"enabled": "false"}},
            "torch_autocast.enabled='false': a string where DeepSpeed expects true or false",
        ),
        ({"bf16": {"enabled": "yes"}}, "bf16.enabled='yes': .* write true without quotes"),
        (
            {"zero_optimization": {"stage": "2"}},
            "zero_optimization.stage='2': a string where DeepSpeed expects a number; write 2 "
            "without quotes",
        ),
        (
            {"zero_allow_untested_optimizer": "true"},
            "zero_allow_untested_optimizer='true': a string where DeepSpeed expects true or false",
        ),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": "1e-3"}}},
            "optimizer.params.lr='1e-3': a string where DeepSpeed expects a number; write 0.001",
        ),
        (
            {"train_micro_batch_size_per_gpu": "1_000"},
            "train_micro_batch_size_per_gpu='1_000': .* without '_' separators",
        ),
        (
            {"train_micro_batch_size_per_gpu": 10**400},
            "train_micro_batch_size_per_gpu=<an integer of about 401 digits>: larger than "
            "9,007,199,254,740,992",
        ),
        ({"gradient_clipping": float("nan")}, "gradient_clipping=nan: must be a finite number"),
        ({1: 2}, "1: keys must be strings"),
        (
            {"zero_optimization": {"stage": True}},
            r"zero_optimization.stage=true: DeepSpeed .* takes a number here, not true/false",
        ),
        ({"fp16": {"enabled": 1}}, r"fp16.enabled=1: DeepSpeed .* takes true or false here"),
        (
            {
                "zero_optimization": {
                    "stage": 3,
                    "offload_param": {"device": "cpu", "pin_memory": 0},
                }
            },
            r"zero_optimization.offload_param.pin_memory=0: DeepSpeed .* takes true or false",
        ),
        ({"torch_autocast": {"enabled": 1}}, r"torch_autocast.enabled=1: must be true or false"),
        ({"zero_allow_untested_optimizer": 1}, r"zero_allow_untested_optimizer=1: must be true"),
        ({"steps_per_print": object()}, "steps_per_print=<object .*: a object is no JSON value"),
    ],
)
def test_no_silent_coercion_each_bad_value_names_its_key_path(
    patch: dict[object, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        import_deepspeed({"train_micro_batch_size_per_gpu": 2, **patch})  # type: ignore[dict-item]


def test_every_problem_of_one_config_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as info:
        import_deepspeed(
            {
                "train_micro_batch_size_per_gpu": "8",
                "fp16": {"enabled": "true"},
                "zero_optimization": {"stage": 7},
                "optimizer": {"type": "NoSuchOpt"},
                "gradient_clipping": -1,
            }
        )
    text = str(info.value)
    assert text.startswith("5 problems in DeepSpeed config:")
    for part in (
        "train_micro_batch_size_per_gpu='8': a string where DeepSpeed expects a number",
        "fp16.enabled='true': a string where DeepSpeed expects true or false",
        "zero_optimization.stage=7:",
        "optimizer.type='NoSuchOpt':",
        "gradient_clipping=-1: must be a finite number >= 0",
    ):
        assert part in text
    # nothing that only follows from the values left out ("at least one batch key")
    assert "at least one must be given" not in text


def test_strings_where_a_string_belongs_are_kept() -> None:
    imported = import_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {
                "stage": 3,
                "offload_param": {"device": "nvme", "nvme_path": "/local/1"},
            },
            "tensorboard": {"enabled": True, "job_name": "2024", "output_path": "0"},
        }
    )
    assert imported.config.offload_params == "nvme" and imported.config.nvme_path == "/local/1"


def test_a_value_with_the_warning_separator_is_listed_not_a_crash() -> None:
    imported = import_deepspeed(
        {
            "train_micro_batch_size_per_gpu": 2,
            "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "a; b"}},
        }
    )
    assert imported.warnings == (
        "not modelled by the workbench, ignored (1): scheduler.params.warmup_type='a, b' "
        "(the workbench warms up linearly)",
    )


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {
                "train_batch_size": 10,
                "train_micro_batch_size_per_gpu": 3,
                "gradient_accumulation_steps": 2,
            },
            r"train_batch_size=10: must equal train_micro_batch_size_per_gpu \(3\) x gradient_accumulation_steps \(2\)",
        ),
        (
            {"train_batch_size": 1000, "gradient_accumulation_steps": 3},
            r"train_batch_size=1000: must equal .* not a multiple of 12",
        ),
        ({"zero_optimization": {"stage": 5}}, rf"zero_optimization.stage=5: {DS} rejects it"),
        (
            {"zero_optimization": {"stage": 3, "bucket": 1}},
            rf"zero_optimization.bucket: {DS} rejects it: not one of its settings here",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memry": 1}}},
            r"zero_optimization.offload_param.pin_memry: .* \(did you mean 'pin_memory'\?\)",
        ),
        ({"optimizer": {"type": "AdamW", "params": {"lr": "x"}}}, r"optimizer.params.lr='x'"),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}},
            rf"optimizer.params.max_grad_norm: {DS} rejects it: .*use 'gradient_clipping'",
        ),
        (
            {"optimizer": {"type": "Lamb", "params": {"lr": 1e-3, "freeze_step": 10}}},
            r"optimizer.params.freeze_step: .*FusedLamb takes no parameter 'freeze_step'",
        ),
        (
            {"optimizer": {"type": "sgd", "params": {"lr": 1e-3}}},
            r"optimizer.type='sgd': .*torch.optim has no 'sgd' \(did you mean 'SGD'\?\)",
        ),
        (
            {"optimizer": {"type": "RMSprop", "params": {"lr": 1e-3}}},
            r"optimizer.type='RMSprop': .*builds it, but the workbench does not model its state",
        ),
        (
            {"fp16": {"enabled": True}, "bf16": {"enabled": True}},
            rf"{DS} rejects the config: bfloat16 and fp16 modes cannot be simultaneously enabled",
        ),
        ({"amp": {"enabled": True}}, rf"{DS} rejects the config: NVIDIA Apex AMP .* removed"),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            r"zero_optimization.offload_param.nvme_path: missing",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "disk"}}},
            r"offload_param.device='disk': .* rejects it: Input should be 'none', 'cpu' or 'nvme'",
        ),
        (
            {"scheduler": {"type": "WarmupCos", "params": {}}},
            r"scheduler.type='WarmupCos': .*\(did you mean 'WarmupCosineLR'\?\)",
        ),
        (
            {"scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}},
            r"warmup_steps: .* \(did you mean 'warmup_num_steps'\?\)",
        ),
        (
            {
                "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4}},
                "zero_optimization": {"stage": 1},
            },
            r"optimizer='onebitadam': DeepSpeed's 1-bit optimizers do not run with ZeRO",
        ),
    ],
)
def test_bad_configs_name_the_key_and_deepspeeds_reason(patch: dict, message: str) -> None:
    base = {"train_micro_batch_size_per_gpu": 4}
    with pytest.raises(ValueError, match=message):
        import_deepspeed({**base, **patch})


def test_what_deepspeed_accepts_imports() -> None:
    """Lenient values DeepSpeed's models accept (the deprecated boolean ZeRO form, an NVMe
    directory that exists on the cluster only) import too; a stage as text does not (it is
    a string where a number belongs: see test_no_silent_coercion_...)."""
    base = {"train_micro_batch_size_per_gpu": 4}
    with pytest.raises(ValueError, match=r"zero_optimization.stage='3': a string where"):
        import_deepspeed({**base, "zero_optimization": {"stage": "3"}})
    legacy = import_deepspeed({**base, "zero_optimization": True})
    assert legacy.config.zero_stage == 1 and "deprecated form" in legacy.warnings[0]
    nvme = import_deepspeed(
        {
            **base,
            "zero_optimization": {
                "stage": 3,
                "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"},
            },
        }
    ).config
    assert (nvme.offload_params, nvme.nvme_path) == ("nvme", "/local_nvme")


def test_setting_errors_name_the_deepspeed_keys() -> None:
    with pytest.raises(ValueError) as info:
        import_deepspeed(
            {
                "train_micro_batch_size_per_gpu": 4,
                "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4}},
                "zero_optimization": {"stage": 1},
            }
        )
    assert str(info.value).endswith("(DeepSpeed keys: optimizer.type, zero_optimization.stage)")


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as info:
        import_deepspeed(
            {
                "train_batch_size": 0,
                "zero_optimization": {"stage": 9},
                "fp16": {"enabled": True, "bogus": 1},
            }
        )
    text = str(info.value)
    assert "3 problems" in text and "train_batch_size=0" in text
    assert "stage=9" in text and "fp16.bogus" in text


def test_world_size_conflict() -> None:
    ds = to_deepspeed(TrainConfig(), world_size=2)
    with pytest.raises(ValueError, match="implies world size 2, but world_size=4"):
        import_deepspeed(ds, world_size=4)
    with pytest.raises(ValueError, match="world_size=0"):
        import_deepspeed(ds, world_size=0)


def test_export_rejects_what_deepspeed_cannot_express() -> None:
    with pytest.raises(ValueError, match="loss_scale_growth=3.0"):
        to_deepspeed(TrainConfig(precision="fp16", loss_scale_growth=3.0))
    with pytest.raises(ValueError, match="loss_scale_init=1000.0: .*power of two"):
        to_deepspeed(TrainConfig(precision="fp16", loss_scale_init=1000.0))
    with pytest.raises(ValueError, match="world_size=0"):
        to_deepspeed(TrainConfig(), world_size=0)


def deepspeeds_batch(keys: dict[str, int], world: int) -> tuple[int, int] | None:
    """(micro, accumulation) as DeepSpeed 0.19 resolves `keys` on `world` ranks
    (`DeepSpeedConfig._configure_train_batch_size`), None when it refuses them."""
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = DeepSpeedConfig.__new__(DeepSpeedConfig)
    cfg.world_size = world
    cfg.train_batch_size = keys.get("train_batch_size")
    cfg.train_micro_batch_size_per_gpu = keys.get("train_micro_batch_size_per_gpu")
    cfg.gradient_accumulation_steps = keys.get("gradient_accumulation_steps")
    try:
        cfg._configure_train_batch_size()
    except AssertionError:
        return None
    return cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "keys",
    [
        {"train_batch_size": 24},
        {"train_micro_batch_size_per_gpu": 3},
        {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3},
        {"train_batch_size": 24, "gradient_accumulation_steps": 2},
        {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2},
        {
            "train_batch_size": 24,
            "train_micro_batch_size_per_gpu": 3,
            "gradient_accumulation_steps": 2,
        },
        {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 5},
        {"train_batch_size": 10, "gradient_accumulation_steps": 4},
        {"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4},
    ],
)
def test_batch_keys_resolve_as_deepspeed_resolves_them(keys: dict[str, int], world: int) -> None:
    expected = deepspeeds_batch(keys, world)
    if expected is None:
        with pytest.raises(ValueError, match=r"train_batch_size=\d+: (must|with micro)"):
            import_deepspeed(keys, world_size=world)
        return
    result = import_deepspeed(keys, world_size=world)
    assert (result.config.micro_batch, result.config.grad_accum) == expected
    assert result.world_size == world


def test_a_config_without_gradient_clipping_clips_as_deepspeed_does() -> None:
    """DeepSpeed clips at its default when the key is absent; the import says so, and the
    export writes it back explicitly (a config that omits the key trains the same way)."""
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

    imported = from_deepspeed({"train_batch_size": 8})
    assert imported.clip_grad_norm == GRADIENT_CLIPPING_DEFAULT == 1.0
    assert to_deepspeed(imported)["gradient_clipping"] == GRADIENT_CLIPPING_DEFAULT
    off = from_deepspeed({"train_batch_size": 8, "gradient_clipping": 0.0})
    assert off.clip_grad_norm is None and to_deepspeed(off)["gradient_clipping"] == 0.0


def test_settings_valid_alone_but_not_together_carry_their_problems_as_data() -> None:
    from workbench.deepspeed.problems import MappedConfigError
    from workbench.problems import problem_lines

    with pytest.raises(MappedConfigError) as info:
        import_deepspeed(
            {
                "train_batch_size": 8,
                "zero_optimization": {"stage": 1},
                "optimizer": {"type": "OneBitAdam"},
            }
        )
    assert str(info.value).startswith("DeepSpeed config maps to an invalid TrainConfig: ")
    assert "(DeepSpeed keys: optimizer.type, zero_optimization.stage)" in str(info.value)
    assert problem_lines(info.value) == [
        "optimizer='onebitadam': DeepSpeed's 1-bit optimizers do not run with ZeRO; needs "
        "zero_stage=0 (zero_stage=1) (DeepSpeed key optimizer.type)"
    ]
