"""The estimator's inputs declared once (`workbench.estimate.schema`): `estimate_memory`'s
signature, the checks of its choices, `workbench estimate`'s flags and the estimator
panel's fields are made from it; one TrainConfig -> estimator mapping
(`workbench.prediction.estimator_inputs`); each TrainConfig `Setting` says what a change
rebuilds and whether it moves the memory prediction."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re

import pytest

from workbench.config import SETTINGS, ConfigError, TrainConfig
from workbench.estimate import estimate_memory
from workbench.estimate.activations import attention_terms
from workbench.estimate.schema import CONFIG_FIELDS, FIELDS, SCHEMA, panel_fields
from workbench.optimizers import OPTIMIZERS


def _estimate_parser() -> argparse.ArgumentParser:
    from workbench.cli import build_parser

    parser, _ = build_parser("estimate")
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["estimate"]


def _by_flag() -> dict[str, argparse.Action]:
    return {opt: a for a in _estimate_parser()._actions for opt in a.option_strings}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from workbench.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ the signature
def test_the_signature_of_estimate_memory_is_the_schema() -> None:
    """Every keyword, in order, with its default: a keyword added to one and not the other
    fails here."""
    params = inspect.signature(estimate_memory).parameters
    assert [p.name for p in params.values()] == [f.name for f in FIELDS]
    for p in params.values():
        assert p.kind is inspect.Parameter.KEYWORD_ONLY, p.name
        assert p.default == SCHEMA[p.name].default, p.name
        assert (p.default is None) <= SCHEMA[p.name].optional, p.name


@pytest.mark.parametrize("field", [f for f in FIELDS if f.choices], ids=lambda f: f.name)
def test_every_declared_choice_is_accepted_and_others_are_refused_with_the_list(field) -> None:
    base = (
        {"n_params": 10**6}
        if field.name
        not in (
            "mlp",
            "norm",
            "bias",
            "positions",
            "activation_function",
            "norm_impl",
            "eager_softmax",
        )
        else {}
    )
    if not base:
        base = {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100}
    if field.name.startswith("lora"):
        base.update(lora_rank=4, lora_params=1000)
    for value in field.choices:
        extra = {"fsdp": {"fsdp": value, "precision": "amp-bf16"}}.get(field.name, {})
        if field.name == "precision" and value in ("bf16-true",):
            extra = {"zero_stage": 0}
        estimate_memory(**{**base, field.name: value, **extra})
    with pytest.raises(ValueError) as info:
        estimate_memory(**{**base, field.name: "no-such-choice"})
    allowed = ", ".join(map(str, field.choices))
    if field.name == "zero_stage":
        allowed = "0, 1, 2 or 3"
    assert allowed in str(info.value)


# ------------------------------------------------------------------ the command line
def test_every_flag_of_the_schema_is_a_flag_of_workbench_estimate() -> None:
    by_flag = _by_flag()
    for f in FIELDS:
        if f.cli_flag is None:
            continue
        assert f.cli_flag in by_flag, f.name
        assert by_flag[f.cli_flag].metavar == f.cli_metavar or f.read in ("switch", "nodrop")
        for alias in f.aliases:
            assert by_flag[alias] is by_flag[f.cli_flag]


def test_a_setting_shared_with_train_config_has_its_flag_and_metavar() -> None:
    """`--activation-checkpointing`, `--tp`, `--pp`, `--attention`, `--lora-rank`, ...: the
    TrainConfig setting's own flag, so it means the same in every command."""
    by_flag = _by_flag()
    shared = {f.name: f.config_field for f in FIELDS if f.config_field and f.cli}
    assert {"checkpointing", "tensor_parallel", "pipeline_parallel", "attention"} <= set(shared)
    for name, config_field in shared.items():
        setting = SETTINGS[config_field]
        if setting.flag is None:  # a setting no other command has a flag for: its own
            assert SCHEMA[name].flag is not None, name
            continue
        assert SCHEMA[name].cli_flag == setting.flag, name
        action = by_flag[setting.flag]
        if setting.metavar is not None:
            assert action.metavar == setting.metavar, name


def test_the_old_checkpointing_flag_is_a_deprecated_alias(capsys) -> None:
    base = ["estimate", "--model", "gpt2", "--json"]
    code, new, _ = _run([*base, "--activation-checkpointing", "selective"], capsys)
    assert code == 0
    code, old, _ = _run([*base, "--checkpointing", "selective"], capsys)
    assert code == 0 and json.loads(old) == json.loads(new)
    assert json.loads(new)["checkpointing"] == "selective"
    code, bare, _ = _run([*base, "--activation-checkpointing"], capsys)
    assert code == 0 and json.loads(bare)["checkpointing"] == "full"
    help_text = " ".join(_by_flag()["--checkpointing"].help.split())
    assert "--checkpointing: the old spelling, still accepted (deprecated)" in help_text
    # an error names the flag as the user spelled it
    code, _, err = _run([*base, "--checkpointing", "some"], capsys)
    assert code == 2 and "--checkpointing some: must be one of" in err
    code, _, err = _run([*base, "--activation-checkpointing", "some"], capsys)
    assert code == 2 and "--activation-checkpointing some: must be one of" in err


def test_attention_model_is_the_models_own_kernel(capsys) -> None:
    base = ["estimate", "--model", "gpt2", "--json"]
    code, own, _ = _run(base, capsys)
    assert code == 0
    code, model, _ = _run([*base, "--attention", "model"], capsys)
    assert code == 0 and json.loads(model) == json.loads(own)
    code, eager, _ = _run([*base, "--attention", "eager"], capsys)
    assert code == 0 and json.loads(eager)["attention"] == "eager"


def test_the_help_lists_the_optimizers_a_session_trains_from_the_table() -> None:
    """The optimizer rows with engines, every one of them, in the table's order."""
    text = " ".join(_by_flag()["--optimizer"].help.split())
    found = re.search(r"a Session trains ([^;]*);", text)
    assert found is not None, text
    listed = [name.strip() for name in found.group(1).split(",")]
    assert listed == [r.name for r in OPTIMIZERS if r.engines]
    assert "paged-adam8bit" in listed  # a row with engines beyond adamw, adam and sgd


def test_a_shared_flags_help_keeps_the_settings_text_whole() -> None:
    """The estimate's default is shown once, beside the choices; the setting's help ends
    as it is written (its closing parenthesis is not taken for a default)."""
    text = " ".join(_by_flag()["--precision"].help.split())
    assert text.startswith("fp32, amp-fp16, amp-bf16, fp16, bf16, bf16-true (fp32); ")
    assert text.endswith(" ".join(SETTINGS["precision"].help.split()))


# ------------------------------------------------------------------ the panel
def test_the_estimator_panels_fields_are_the_schemas() -> None:
    from workbench.ui.estimator import LABELS, EstimatorPanel

    panel = EstimatorPanel()
    try:
        assert set(panel.fields) == {f.name for f in FIELDS if f.label is not None}
        assert {f.name: f.label for f in FIELDS if f.label is not None} == LABELS
        for name in ("precision", "optimizer", "checkpointing", "attention", "optimizer_impl"):
            assert list(panel.fields[name].widget.options) == list(SCHEMA[name].choices), name
        assert panel_fields("model")[:2] == ("model", "n_params")
        assert panel_fields("setup")[:3] == ("precision", "optimizer", "checkpointing")
    finally:
        panel.close()


# ------------------------------------------------------------------ one mapping
class _Model:
    n_params = 124_000_000
    layers, hidden, heads, seq_len, vocab = 12, 768, 12, 256, 50257
    dropout = 0.0
    attention = "megatron"


def test_the_prediction_is_the_estimate_of_the_mapped_inputs() -> None:
    """A setup written out by hand: the prediction is the estimator's figure for it."""
    from workbench.prediction import estimator_inputs, predict_memory

    config = TrainConfig(
        precision="amp-bf16",
        micro_batch=4,
        grad_accum=2,
        activation_checkpointing="selective",
        attention="eager",
        weight_decay=0.1,
        activation_offload=True,
    )
    inputs = estimator_inputs(config, 1, model=_Model())
    assert inputs["checkpointing"] == "selective" and inputs["attention"] == "megatron"
    assert inputs["accounting"] == "paper" and inputs["gpus"] == 1
    by_hand = estimate_memory(
        n_params=_Model.n_params,
        layers=12,
        hidden=768,
        heads=12,
        seq_len=256,
        vocab=50257,
        dropout=False,
        attention="megatron",
        precision="amp-bf16",
        micro_batch=4,
        grad_accum=2,
        checkpointing="selective",
        weight_decay=0.1,
        activation_offload=True,
    )
    assert predict_memory(config, _Model()).to_dict() == by_hand.to_dict()


def test_a_planner_settings_mapping_reads_only_what_it_holds() -> None:
    from workbench.prediction import estimator_inputs

    got = estimator_inputs(
        {"precision": "bf16", "zero_stage": 2, "offload_optimizer": "cpu", "lora_rank": 8}, 16
    )
    assert got == {
        "gpus": 16,
        "precision": "bf16",
        "zero_stage": 2,
        "offload_optimizer": True,
        "lora_rank": 8,
        "lora_targets": "all-linear",
        "lora_params": None,
    }


def test_each_config_field_of_the_schema_is_mapped() -> None:
    """The estimator keyword a TrainConfig field shares is set from that field."""
    from workbench.prediction import ESTIMATOR_FIELDS, estimator_inputs

    inputs = estimator_inputs(TrainConfig(lora_rank=4, qlora=True), 1, model=_Model())
    for keyword, config_field in CONFIG_FIELDS.items():
        assert keyword in inputs, keyword
        assert config_field in ESTIMATOR_FIELDS, keyword


@pytest.mark.parametrize(
    ("kernel", "own", "terms"),
    [
        ("model", None, None),
        ("model", "megatron", "megatron"),
        ("sdpa", "megatron", "sdpa"),
        ("eager", "megatron", "megatron"),
        ("eager", None, "eager"),
        ("eager", "sdpa", "eager"),
        ("flash_attention_2", None, "sdpa"),
        ("megatron", None, "megatron"),
    ],
)
def test_one_translation_of_the_attention_kernel(kernel, own, terms) -> None:
    assert attention_terms(kernel, own) == terms


# ------------------------------------------------------------------ what a change does
def _alternatives(name: str, value: object) -> list[object]:
    spec = SETTINGS[name]
    if spec.kind == "choice":
        enum = type(value)
        return [m for m in enum if m != value]  # type: ignore[attr-defined]
    if spec.kind == "bool":
        return [not value]
    if spec.kind == "int":
        return [v for v in (*spec.values, 0, 1, 2, 3, 4, 16) if v != value]
    if spec.kind == "float":
        return [v for v in (0.0, 0.1, 0.5, 2.0, 1e-3) if v != value]
    if name == "fsdp_units":  # its keywords (a list of names reads as "blocks-only")
        return [v for v in ("blocks", "blocks-only") if v != value]
    return []


def _moves(name: str) -> bool:
    """Whether some valid value of setting `name` changes the estimator's inputs, from the
    default config, from one with LoRA and tensor parallelism on and from one with four
    micro-batches a step (which pipeline stages need) and from ZeRO stage 3 (which offload
    needs)."""
    from workbench.prediction import estimator_inputs

    bases = (
        TrainConfig(),
        TrainConfig(lora_rank=4, tp=2),
        TrainConfig(grad_accum=4),
        TrainConfig(zero_stage=3),
    )
    for base in bases:
        before = estimator_inputs(base, 4, model=_Model(), lora_params=10)
        for value in _alternatives(name, getattr(base, name)):
            try:
                changed = base.replace(**{name: value})
            except ConfigError:
                continue
            if estimator_inputs(changed, 4, model=_Model(), lora_params=10) != before:
                return True
    return False


def test_moves_memory_is_what_the_prediction_reads() -> None:
    """A setting moves the memory prediction exactly when changing it changes the
    estimator's inputs; `lora_targets` moves it through the module's adapter count (the
    Session counts the adapters of the targets it names)."""
    from workbench.prediction import ESTIMATOR_FIELDS

    through_module = {"lora_targets"}
    moving = {name for name, spec in SETTINGS.items() if spec.moves_memory}
    assert moving == ESTIMATOR_FIELDS | through_module
    for name, spec in SETTINGS.items():
        if name in through_module:
            assert spec.moves_memory, name
            continue
        assert spec.moves_memory == _moves(name), name


def test_the_training_panel_measures_memory_again_after_every_setting_that_moves_it() -> None:
    from workbench.ui.training import MEMORY_FIELDS

    assert {"grad_accum", "optimizer_in_backward", "activation_offload", "lora_rank"} <= (
        MEMORY_FIELDS
    )
    assert {name for name, spec in SETTINGS.items() if spec.moves_memory} == MEMORY_FIELDS
    assert "lr" not in MEMORY_FIELDS and "seed" not in MEMORY_FIELDS


def test_what_a_change_rebuilds_is_what_the_live_session_rebuilds() -> None:
    """The declared `rebuilds` equal the sets the Session's change queue rebuilds from."""
    from workbench.train.changes import BACKEND_FIELDS, DATA_FIELDS
    from workbench.train.techniques.lora import LORA_FIELDS

    declared = {f.name: SETTINGS[f.name].rebuilds for f in dataclasses.fields(TrainConfig)}
    # what the data loader and the backend read when they are built
    assert {"micro_batch", "num_workers", "pin_memory", "seed"} == DATA_FIELDS
    assert LORA_FIELDS | {
        "precision", "optimizer", "lr", "weight_decay", "momentum", "lr_schedule",
        "warmup_steps", "total_steps", "lr_scaling", "clip_grad_norm", "zero_stage",
        "compile", "fsdp", "fsdp_reduce_fp32", "fsdp_units", "offload_optimizer", "offload_params",
        "nvme_path", "loss_scale_init", "loss_scale_growth", "loss_scale_backoff",
        "loss_scale_interval", "grad_accum", "micro_batch", "optimizer_in_backward",
        "pp_schedule",
    } == BACKEND_FIELDS  # fmt: skip
    assert {n for n, r in declared.items() if "model" in r} == {
        "activation_checkpointing",
        "attention",
    }
    assert declared["activation_offload"] == ("forward",)
    allowed = {"data", "backend", "model", "forward"}
    assert all(set(r) <= allowed for r in declared.values())


def test_every_number_of_the_schema_has_its_range_in_limits() -> None:
    """The ranges the checks enforce (`workbench.estimate.limits.LIMITS`) cover every
    numeric keyword the schema declares, and nothing else."""
    from workbench.estimate.limits import LIMITS

    numbers = {f.name for f in FIELDS if f.kind in ("int", "float", "count") and not f.choices}
    assert numbers == set(LIMITS) - {"max_positions"}
