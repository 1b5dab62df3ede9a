"""workbench.cli.config_flags: TrainConfig fields as flags, shared by export and launch."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli.config_flags import add_config_flags, config_from_args
from workbench.config import TrainConfig, problem_lines

FIELDS = ("precision", "zero_stage", "lr", "offload_optimizer", "nvme_path", "pin_memory")


def parse(argv: list[str], **kwargs: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser, fields=FIELDS, **kwargs)  # type: ignore[arg-type]
    return parser.parse_args(argv)


def test_module_is_pure() -> None:
    code = "import sys, workbench.cli.config_flags; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_flags_become_changes_on_the_base() -> None:
    args = parse(["--precision", "bf16", "--zero", "2", "--lr", "0.01", "--pin-memory"])
    base = TrainConfig(seed=7)
    config, problems = config_from_args(args, fields=FIELDS, base=base)
    assert problems == []
    assert config == base.replace(precision="bf16", zero_stage=2, lr=0.01, pin_memory=True)


def test_absent_flags_keep_the_base() -> None:
    base = TrainConfig(zero_stage=3, offload_optimizer="cpu")
    assert config_from_args(parse([]), fields=FIELDS, base=base) == (base, [])
    assert config_from_args(parse([]), fields=FIELDS) == (TrainConfig(), [])


def test_bare_offload_means_cpu_only_when_asked() -> None:
    args = parse(["--zero", "1", "--offload-optimizer"], bare_offload=True)
    config, _ = config_from_args(args, fields=FIELDS)
    assert config is not None and config.offload_optimizer == "cpu"
    with pytest.raises(SystemExit):
        parse(["--offload-optimizer"])


def test_value_style_names_flag_and_typed_value() -> None:
    args = parse(["--zero", "seven", "--precision", "fp64"])
    config, problems = config_from_args(args, fields=FIELDS)
    assert config is None
    assert sorted(problems) == sorted(
        [
            "--zero seven: must be 0, 1, 2 or 3",
            "--precision fp64: must be one of fp32, amp-fp16, amp-bf16, fp16, bf16, bf16-true",
        ]
    )


def test_parenthesized_style_and_number_check() -> None:
    config, problems = config_from_args(
        parse(["--zero", "7"]), fields=FIELDS, check_numbers=True, style="parenthesized"
    )
    assert config is None and problems == ["--zero (zero_stage=7: must be 0, 1, 2 or 3)"]
    config, problems = config_from_args(
        parse(["--zero", "x", "--lr", "fast"]), fields=FIELDS, check_numbers=True
    )
    assert config is None
    assert problems == ["--zero x: must be an integer", "--lr fast: must be a finite number"]


@pytest.mark.parametrize("text", ["inf", "nan", "1e999"])
def test_number_check_refuses_non_finite_floats(text: str) -> None:
    config, problems = config_from_args(parse(["--lr", text]), fields=FIELDS, check_numbers=True)
    assert config is None and problems == [f"--lr {text}: must be a finite number"]


def test_thousands_separators_count_only_where_they_group_threes() -> None:
    """docs/bad_input.md rule 3: "1,024" is 1024; "1,02,4" groups nothing and is refused
    saying so."""
    parser = argparse.ArgumentParser()
    add_config_flags(parser, fields=("micro_batch",))
    args = parser.parse_args(["--micro-batch", "1,024"])
    config, problems = config_from_args(args, fields=("micro_batch",), check_numbers=True)
    assert problems == [] and config is not None and config.micro_batch == 1024
    args = parser.parse_args(["--micro-batch", "1,02,4"])
    config, problems = config_from_args(args, fields=("micro_batch",), check_numbers=True)
    assert config is None
    assert problems == [
        "--micro-batch 1,02,4: must be an integer (commas only group digits in threes)"
    ]


def test_lenient_numbers_pass_non_finite_text_on_to_be_named() -> None:
    config, problems = config_from_args(parse(["--lr", "inf"]), fields=FIELDS)
    assert config is None and len(problems) == 1 and problems[0].startswith("--lr inf: must be")


def test_strip_text_only_when_asked(tmp_path: Path) -> None:
    argv = ["--zero", "1", "--offload-optimizer", "nvme", "--nvme-path", f" {tmp_path} "]
    config, problems = config_from_args(parse(argv), fields=FIELDS, strip_text=True)
    assert problems == [] and config is not None and config.nvme_path == str(tmp_path)
    config, problems = config_from_args(parse(argv), fields=FIELDS, style="parenthesized")
    assert problems == [] and config is not None and config.nvme_path == f" {tmp_path} "


def test_problem_lines_drop_the_header() -> None:
    with pytest.raises(ValueError) as info:
        TrainConfig(zero_stage=7, precision="x")
    lines = problem_lines(info.value)
    assert len(lines) == 2 and all("=" in ln and "invalid" not in ln for ln in lines)


def test_the_flags_are_the_settings_declared_flags() -> None:
    from workbench.cli.config_flags import CONFIG_FLAGS
    from workbench.config import SETTINGS

    declared = {name: spec.flag for name, spec in SETTINGS.items() if spec.flag}
    assert {name: f.flag for name, f in CONFIG_FLAGS.items()} == declared
    assert len(set(declared.values())) == len(declared)  # one flag, one setting
    assert CONFIG_FLAGS["micro_batch"].help == "samples per forward pass per rank (8)"
    assert CONFIG_FLAGS["zero_stage"].kind == "int" and CONFIG_FLAGS["pin_memory"].kind == "switch"


def test_a_bad_number_and_the_other_settings_problems_come_together() -> None:
    config, problems = config_from_args(
        parse(["--lr", "fast", "--zero", "7"]), fields=FIELDS, check_numbers=True
    )
    assert config is None
    assert problems == ["--lr fast: must be a finite number", "--zero 7: must be 0, 1, 2 or 3"]


def test_a_config_error_carries_its_problems_as_data() -> None:
    from workbench.config import ConfigError, SettingProblem

    with pytest.raises(ConfigError) as info:
        TrainConfig(zero_stage=2, fsdp="full_shard", lr=-1)
    problems = info.value.problems
    assert all(isinstance(p, SettingProblem) for p in problems)
    assert [(p.field, p.value) for p in problems] == [("lr", -1), ("fsdp", "full_shard")]
    assert str(problems[1]).startswith("fsdp='full_shard': PyTorch FSDP and DeepSpeed ZeRO")
    assert "(zero_stage=2 needs fsdp='off', fsdp needs zero_stage=0)" in str(problems[1])
    flags = {"zero_stage": "--zero", "fsdp": "--fsdp"}
    assert problems[1].render(name=lambda f: flags.get(f, f), value_text="full_shard", sep=" ") == (
        "--fsdp full_shard: PyTorch FSDP and DeepSpeed ZeRO are two sharding engines; use one "
        "(--zero 2 needs --fsdp 'off', --fsdp needs --zero 0)"
    )


def test_a_value_with_colons_and_equals_signs_is_shown_as_typed() -> None:
    # the flag's line is made from the problem's data: text such as ": x=1" inside the
    # value cannot be mistaken for the message
    config, problems = config_from_args(parse(["--precision", "fp16: x=1"]), fields=FIELDS)
    assert config is None
    assert problems == [
        "--precision fp16: x=1: must be one of fp32, amp-fp16, amp-bf16, fp16, bf16, bf16-true"
    ]


@pytest.mark.parametrize("command", ["launch", "ladder", "compress"])
def test_every_command_reads_model_options_with_the_one_parser(command: str) -> None:
    """`--model-options` is one flag: the same help and, for the same text, the same
    problem in launch, ladder and compress."""
    from workbench.cli import build_parser
    from workbench.cli.model_flags import parse_model_options

    parser, _ = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    (action,) = [a for a in sub.choices[command]._actions if "--model-options" in a.option_strings]
    assert action.metavar == "JSON" and action.default is None
    assert str(action.help).startswith("options of the model as a JSON object")
    for text, problem in (
        ("[1]", "--model-options [1]: must be a JSON object of option names and values"),
        ('{"a": 1, "a": 2}', "key 'a' appears twice in one object"),
        ("[" * 9 + "]" * 9, "nested deeper than 8 levels"),
    ):
        problems: list[str] = []
        assert parse_model_options(text, problems) is None
        (line,) = problems
        assert line.startswith(f"--model-options {text}: ") and problem in line
    problems = []
    assert parse_model_options('{"layers": 2}', problems) == {"layers": 2} and problems == []
    assert parse_model_options(None, problems) is None and problems == []
