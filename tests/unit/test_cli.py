"""`workbench estimate`: in-process through main(argv), subprocess for exit codes and imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors and --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_for_175b_fp32(capsys):
    code, out, _ = run(
        [
            "estimate",
            "--params",
            "175e9",
            "--precision",
            "fp32",
            "--optimizer",
            "adamw",
            "--zero",
            "0",
            "--gpus",
            "1",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    d = json.loads(out)
    assert (d["params_bytes"], d["grads_bytes"], d["optimizer_bytes"]) == (700e9, 700e9, 1400e9)
    assert d["total_bytes"] == 2800e9 and d["activation_bytes"] is None
    assert d["n_params"] == 175 * 10**9
    for key in (
        "overhead_bytes",
        "cpu_offload_bytes",
        "gpu",
        "gpu_memory_bytes",
        "fits",
        "max_micro_batch",
    ):
        assert key in d


def test_json_zero2_on_64_gpus(capsys):
    code, out, _ = run(
        [
            "estimate",
            "--params",
            "7.5e9",
            "--precision",
            "fp16",
            "--optimizer",
            "adam",
            "--zero",
            "2",
            "--gpus",
            "64",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    assert round(json.loads(out)["total_bytes"] / 1e9, 1) == 16.6


def test_gpt3_shape_on_h100(capsys):
    argv = [
        "estimate",
        "--layers",
        "96",
        "--hidden",
        "12288",
        "--heads",
        "96",
        "--vocab",
        "50257",
        "--seq-len",
        "2048",
        "--micro-batch",
        "1",
        "--checkpointing",
        "full",
        "--precision",
        "bf16",
        "--zero",
        "3",
        "--gpus",
        "1024",
        "--gpu",
        "h100-80gb",
    ]
    code, out, _ = run([*argv, "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    from workbench.estimate import estimate_memory

    e = estimate_memory(
        layers=96,
        hidden=12288,
        heads=96,
        vocab=50257,
        seq_len=2048,
        checkpointing="full",
        precision="bf16",
        zero_stage=3,
        gpus=1024,
        gpu="h100-80gb",
    )
    assert d == json.loads(json.dumps(e.to_dict()))
    assert d["gpu"] == "h100-80gb" and d["fits"] is True and d["max_micro_batch"] >= 1
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert "h100-80gb" in out and "fits" in out and "largest micro-batch that fits:" in out
    assert f"{e.total_bytes / 2**30:,.2f}" in out  # GiB by default


def test_human_table_says_its_unit(capsys):
    _, out, _ = run(["estimate", "--params", "175e9"], capsys)
    assert "GiB (2^30 bytes)" in out and "2,607.70" in out  # 2.8e12 bytes in GiB
    assert "activations" in out and "not counted" in out
    _, out, _ = run(["estimate", "--params", "175e9", "--units", "gb"], capsys)
    assert "GB (10^9 bytes)" in out and "2,800.00" in out


def test_compare_stages_table_and_json(capsys):
    argv = [
        "estimate",
        "--params",
        "7.5e9",
        "--precision",
        "fp16",
        "--optimizer",
        "adam",
        "--gpus",
        "64",
        "--compare-stages",
    ]
    code, out, _ = run([*argv, "--units", "gb"], capsys)
    assert code == 0
    total = next(line for line in out.splitlines() if line.startswith("states + activations"))
    assert total.split()[3:] == ["120.00", "31.41", "16.64", "1.88"]
    code, out, _ = run([*argv, "--json"], capsys)
    stages = json.loads(out)["stages"]
    assert [s["zero_stage"] for s in stages] == [0, 1, 2, 3]
    assert [round(s["total_bytes"] / 1e9, 1) for s in stages] == [120.0, 31.4, 16.6, 1.9]


def test_time_and_cost(capsys):
    code, out, _ = run(
        [
            "estimate",
            "--params",
            "7e9",
            "--precision",
            "bf16",
            "--gpus",
            "8",
            "--gpu",
            "h100",
            "--tokens",
            "1e12",
            "--price-per-gpu-hour",
            "3",
            "--json",
        ],
        capsys,
    )
    d = json.loads(out)
    assert d["train_flops"] == 6 * 7e9 * 1e12
    assert d["cost"] == pytest.approx(d["train_seconds"] / 3600 * 8 * 3)


def test_offload_flags(capsys):
    code, out, _ = run(
        [
            "estimate",
            "--params",
            "1e9",
            "--precision",
            "bf16",
            "--zero",
            "3",
            "--gpus",
            "4",
            "--offload-optimizer",
            "--offload-params",
            "--json",
        ],
        capsys,
    )
    d = json.loads(out)
    assert d["total_bytes"] == 0 and d["cpu_offload_bytes"] == 16 * 250_000_000


def test_list_gpus(capsys):
    code, out, _ = run(["estimate", "--list-gpus"], capsys)
    assert code == 0
    for name in ("h100-80gb", "a100-40gb", "mi300x", "rtx-4090", "t4"):
        assert name in out
    code, out, _ = run(["estimate", "--list-gpus", "--json"], capsys)
    assert {g["name"] for g in json.loads(out)["gpus"]} >= {"h200-141gb", "l40s"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zero", "5"], "error: --zero 5: must be 0, 1, 2 or 3"),
        (["--zero", "two"], "error: --zero two: must be 0, 1, 2 or 3"),
        (
            ["--precision", "fp64"],
            "error: --precision fp64: must be one of fp32, amp-fp16, amp-bf16, fp16, bf16, bf16-true",
        ),
        (
            ["--optimizer", "rmsprop9"],
            "error: --optimizer rmsprop9: must be one of adamw, adam, sgd",
        ),
        (
            ["--gpu", "a100"],
            "error: --gpu a100: is ambiguous: say which one of a100-40gb, a100-80gb",
        ),
        (["--gpu", "b300"], "error: --gpu b300: unknown GPU; known GPUs: v100-16gb"),
        (["--gpus", "0"], "error: --gpus 0: must be an integer from 1 to 10^7"),
        (["--gpus", "2.5"], "error: --gpus 2.5: must be an integer from 1 to 10^7"),
        (["--offload-params"], "error: --offload-params: needs --zero 3 (got 0)"),
        (["--offload-optimizer"], "error: --offload-optimizer: needs --zero 1, 2 or 3 (got 0)"),
        (
            ["--layers", "2"],
            "error: --hidden is missing: a transformer shape needs all of --layers, --hidden",
        ),
        (
            ["--layers", "2", "--hidden", "10", "--heads", "3", "--seq-len", "4", "--vocab", "5"],
            "error: --heads 3: must divide --hidden=10 evenly",
        ),
        (
            ["--mfu", "1.5"],
            "error: --mfu 1.5: more than 1 (a utilisation is a fraction of the peak rate); allowed: a finite number from 0.001 to 1",
        ),
        (["--mfu", "fast"], "error: --mfu fast: must be a finite number from 0.001 to 1"),
        (["--tokens", "-1"], "error: --tokens -1: must be a finite number > 0 and <= 10^16"),
        (
            ["--overhead-gib", "nan"],
            "error: --overhead-gib nan: must be a finite number from 0 to 1,024",
        ),
        (["--units", "tb"], "error: --units tb: must be gib or gb"),
        (
            ["--checkpointing", "some"],
            "error: --checkpointing some: must be one of none, selective, selective-op, full",
        ),
        (["--micro-batch", "0"], "error: --micro-batch 0: must be an integer from 1 to 10^6"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args, message, capsys):
    code, out, err = run(["estimate", "--params", "1e9", *args], capsys)
    assert code == 2 and out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_bad_params_and_missing_model(capsys):
    code, _, err = run(["estimate", "--params", "1.5"], capsys)
    assert code == 2 and "--params 1.5: must be a whole number from 1 to 10^16" in err
    code, _, err = run(["estimate", "--params=-7e9"], capsys)
    assert code == 2 and "--params -7e9: must be a whole number from 1 to 10^16" in err
    # argparse reads "-7e9" after a space as an option: still one line and status 2
    code, _, err = run(["estimate", "--params", "-7e9"], capsys)
    assert code == 2 and err.strip() == "workbench estimate: error: --params expected one argument"
    code, _, err = run(["estimate"], capsys)
    assert (
        code == 2 and "--params is missing: give --params, a --model or a transformer shape" in err
    )


def test_several_problems_on_one_line(capsys):
    code, _, err = run(["estimate", "--params", "1e9", "--zero", "7", "--precision", "x"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--precision x: must be one of" in err and "--zero 7: must be 0, 1, 2 or 3" in err


def test_unreadable_and_out_of_range_values_are_reported_together(capsys):
    argv = ["estimate", "--layers", "0", "--hidden", "-1", "--heads", "x", "--seq-len", "1.5"]
    code, out, err = run([*argv, "--vocab", "nan", "--mfu", "fast", "--units", "tb"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    for part in (
        "--layers 0: must be an integer from 1 to 10^5",
        "--hidden -1: must be an integer from 1 to 10^6",
        "--heads x: must be an integer from 1 to 10^6",
        "--seq-len 1.5: must be an integer from 1 to 10^9",
        "--vocab nan: must be an integer from 1 to 10^9",
        "--mfu fast: must be a finite number from 0.001 to 1",
        "--units tb: must be gib or gb",
    ):
        assert part in err


def test_zero_flag_is_refused_with_compare_stages(capsys):
    argv = ["estimate", "--params", "1e9", "--compare-stages", "--zero"]
    code, out, err = run([*argv, "2"], capsys)
    assert code == 2 and out == ""
    assert "--zero 2: leave it out with --compare-stages" in err
    code, _, err = run([*argv, "9"], capsys)  # not silently ignored either
    assert code == 2 and "--zero 9" in err


def test_zero_defaults_to_stage_0(capsys):
    code, out, _ = run(["estimate", "--params", "1e9", "--json"], capsys)
    assert code == 0 and json.loads(out)["zero_stage"] == 0


def test_headline_of_absurd_sizes_stays_readable(capsys):
    code, out, _ = run(["estimate", "--params", "1e16"], capsys)
    assert code == 0 and out.splitlines()[0].startswith("1e+16 parameters, fp32")
    _, out, _ = run(["estimate", "--params", "7.5e9"], capsys)
    assert out.splitlines()[0].startswith("7.5B parameters")


# ------------------------------------------------------------------ hostile input
BIG = str(10**65)
SHAPE = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "128", "--vocab", "100"]


def _one_error(argv, capsys) -> str:
    code, out, err = run(["estimate", *argv], capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err.strip()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--params", "1e9", *SHAPE[:6], "--seq-len", BIG, "--vocab", "100"],
            f"--seq-len {BIG}: more than 10^9 tokens (the longest contexts are about 10^7 "
            "tokens); allowed: an integer from 1 to 10^9",
        ),
        (
            ["--params", "1e9", *SHAPE[:6], "--seq-len", "1e59", "--vocab", "100"],
            "--seq-len 1e59: more than 10^9 tokens",
        ),
        (
            ["--params", "1e9", "--micro-batch", BIG],
            f"--micro-batch {BIG}: more than 10^6 samples per GPU",
        ),
        (
            ["--params", "1e9", "--micro-batch", "1e20"],
            "--micro-batch 1e20: more than 10^6 samples per GPU (a micro-batch is what one GPU "
            "holds); allowed: an integer from 1 to 10^6",
        ),
        (
            ["--params", "1e9", "--overhead-gib", "1e300"],
            "--overhead-gib 1e300: more than 1,024 GiB per GPU (no GPU holds 1 TiB); allowed: "
            "a finite number from 0 to 1,024",
        ),
        (
            ["--params", "1e9", "--tokens", "1e308", "--gpu", "h100"],
            "--tokens 1e308: more than 10^16 tokens (10^3 times the largest training sets)",
        ),
        (["--params", "1e9", "--tokens", "inf"], "--tokens inf: must be a finite number > 0"),
        (
            ["--params", "1e9", "--mfu", "1e-300"],
            "--mfu 1e-300: must be a finite number from 0.001",
        ),
        (
            ["--params", "1e9", "--price-per-gpu-hour", "1e300", "--tokens", "1e12"],
            "--price-per-gpu-hour 1e300: more than 10^6 per GPU-hour",
        ),
        (["--params", "1e9", "--gpus", "1e8"], "--gpus 1e8: more than 10^7 GPUs"),
        (["--params", "1e17"], "--params 1e17: more than 10^16 parameters"),
        (
            ["--params", "1,2,3"],
            "--params 1,2,3: must be a whole number from 1 to 10^16 (e.g. 7B, 1.5e9, 350M or "
            "1.3T); separators must group the digits by three (1,000,000 or 1_000_000)",
        ),
        (["--params", "1e9", "--gpus", "1,6"], "--gpus 1,6: must be an integer from 1 to 10^7"),
        (["--params", "1e9", "--gpus", "1_6"], "--gpus 1_6: must be an integer from 1 to 10^7"),
        (["--params", "1e9", "--gpu", "x\ny"], "--gpu 'x\\ny': unknown GPU"),
        (["--params", "1e9", "--gpu", "x" * 300], "--gpu 'xxxxxxxxx"),
    ],
)
def test_hostile_numbers_exit_2_with_one_clear_line(args, message, capsys):
    err = _one_error(args, capsys)
    assert message in err
    assert "inf" not in err.replace("--tokens inf", "").replace("info", "")


def test_empty_and_padded_values_are_quoted_and_every_split_is_named(capsys):
    err = _one_error(["--hf-config", ""], capsys)
    assert "--hf-config '': must be a path to a config.json or a dict" in err
    err = _one_error(["--params", "1e9", "--gpu", " h200 x"], capsys)
    assert "--gpu ' h200 x': unknown GPU" in err
    err = _one_error(["--params", "1e9", "--gpus", "4", "--tp", "2", "--pp", "2"], capsys)
    assert "--tp 2: needs a transformer shape" in err and "--pp 2: needs a transformer shape" in err


def test_huge_numbers_in_a_config_exit_2(tmp_path, capsys):
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 10**400,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 128,
        "model_type_extra": ["x"],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    err = _one_error(["--hf-config", str(path)], capsys)
    assert (
        f"--hf-config {path}: hidden_size <an integer of about 401 digits>: more than 10^6" in err
    )
    path.write_text(json.dumps({**config, "hidden_size": 64, "model_type": ["llama"]}))
    err = _one_error(["--hf-config", str(path)], capsys)
    assert f"--hf-config {path}: model_type ['llama'] is not supported; supported: gpt2" in err


def test_config_strings_for_flags_and_numbers_exit_2_naming_every_key(tmp_path, capsys):
    config = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 2,
        "hidden_size": "64",
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "vocab_size": 100,
        "max_position_embeddings": 128,
        "tie_word_embeddings": "false",
        "use_parallel_residual": "no",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    err = _one_error(["--hf-config", str(path)], capsys)
    assert err == (
        f"workbench estimate: error: --hf-config {path}: hidden_size '64' is a string: must be "
        f"an integer from 1 to 10^6; --hf-config {path}: tie_word_embeddings 'false' is a "
        f"string: must be true or false; --hf-config {path}: use_parallel_residual 'no' is a "
        "string: must be true or false"
    )


def test_config_files_that_cannot_be_read_exit_2_without_hanging(tmp_path, capsys):
    import os

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    twice = tmp_path / "twice.json"
    twice.write_text('{"model_type": "gpt2", "n_layer": 32, "n_layer": 320}')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    long_name = "a" * 300
    for path, reason in (
        (deep, f"--hf-config {deep}: nested deeper than 64 levels"),
        (twice, f"--hf-config {twice}: key 'n_layer' appears twice in one object"),
        (fifo, f"--hf-config {fifo}: a FIFO (named pipe), not a regular file"),
        ("/dev/urandom", "--hf-config /dev/urandom: a device, not a regular file"),
        ("/dev/zero", "--hf-config /dev/zero: a device, not a regular file"),
        (long_name, f"--hf-config '{'a' * 76}...: cannot be read (File name too long)"),
    ):
        assert reason in _one_error(["--hf-config", str(path)], capsys)


def test_huge_valid_setups_print_finite_readable_figures(capsys):
    code, out, _ = run(
        [
            "estimate",
            "--params",
            "1e16",
            "--tokens",
            "1e16",
            "--gpu",
            "t4",
            "--mfu",
            "0.001",
            "--price-per-gpu-hour",
            "1e6",
        ],
        capsys,
    )
    assert code == 0 and "inf" not in out and "nan" not in out
    assert "compute: 6 x params x tokens = 6e+32 FLOPs; 8.57e+17 days on 1 x t4" in out
    assert "cost 2.06e+25 at 1e+06 per GPU-hour" in out
    code, _, err = run(
        [
            "estimate",
            *("--model", "llama-3-8b", "--seq-len", "1000000000", "--gpu", "h100"),
            *("--attention", "megatron"),
        ],
        capsys,
    )
    assert code == 2 and (
        "--seq-len 1000000000: gives 3.81e+12 GiB of activations per GPU, more than 2^30 GiB "
        "(a million GPUs' memory): lower --micro-batch or --seq-len" in err
    )


def test_gpu_named_as_the_driver_reports_it(capsys):
    code, out, _ = run(["estimate", "--params", "1e9", "--gpu", "NVIDIA H100 80GB HBM3"], capsys)
    assert code == 0 and "h100-80gb: 79.11 GiB per GPU -> the peak + reserve fits" in out


def test_no_command_and_unknown_command(capsys):
    code, _, err = run([], capsys)
    assert code == 2 and "a command is required: estimate" in err
    code, _, err = run(["frobnicate"], capsys)
    assert code == 2 and "invalid choice: 'frobnicate'" in err


def test_subcommands_are_loaded_only_when_they_run(monkeypatch):
    calls = []

    def adder(parser):
        calls.append(parser.prog)
        parser.add_argument("--n", type=int, default=1)
        return lambda args: 40 + args.n

    import types

    fake = types.ModuleType("fake_cmd")
    fake.add_parser = adder  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_cmd", fake)
    monkeypatch.setitem(COMMANDS, "fake", ("fake_cmd:add_parser", "a test command"))
    assert main(["estimate", "--params", "10", "--json"]) == 0
    assert calls == []  # not loaded for another command
    assert main(["fake", "--n", "2"]) == 42
    assert calls == ["workbench fake"]
    parser, runner = build_parser(None)
    assert runner is None and "fake" in parser.format_help()


# ------------------------------------------------------------------ models, parallelism
def test_model_preset_json_and_human_report(capsys):
    argv = ["estimate", "--model", "llama-3-8b", "--precision", "bf16", "--gpus", "64"]
    argv += ["--tp", "8", "--pp", "2", "--sequence-parallel", "--checkpointing", "selective"]
    code, out, _ = run([*argv, "--json"], capsys)
    assert code == 0
    d = json.loads(out)
    assert (d["model"], d["n_params"], d["kv_heads"], d["ffn_hidden"]) == (
        "llama-3-8b",
        8_030_261_248,
        8,
        14336,
    )
    assert (d["tensor_parallel"], d["pipeline_parallel"], d["data_parallel"]) == (8, 2, 4)
    assert d["sequence_parallel"] is True and d["activations"]["in_flight_micro_batches"] == 2
    from workbench.estimate import estimate_memory

    e = estimate_memory(
        model="llama-3-8b",
        precision="bf16",
        gpus=64,
        tensor_parallel=8,
        pipeline_parallel=2,
        sequence_parallel=True,
        checkpointing="selective",
    )
    assert d == json.loads(json.dumps(e.to_dict()))
    code, out, _ = run(argv, capsys)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("llama-3-8b (8.03B parameters), bf16")
    assert "tp 8 x pp 2 x dp 4 (sequence parallel)" in lines[0]
    assert lines[1].startswith("shape: 32 layers, hidden 4096, 32 heads (8 kv), swiglu MLP 14336")
    assert "parameters per GPU before ZeRO: 502M" in out


def test_shape_flags_override_the_model(capsys):
    code, out, _ = run(
        ["estimate", "--model", "llama-3-8b", "--seq-len", "32768", "--json"], capsys
    )
    d = json.loads(out)
    assert code == 0 and d["seq_len"] == 32768 and d["n_params"] == 8_030_261_248
    code, out, _ = run(["estimate", "--model", "gpt2", "--embeddings", "untied", "--json"], capsys)
    assert code == 0 and json.loads(out)["n_params"] == 124_439_808 + 50257 * 768


def test_list_models(capsys):
    code, out, _ = run(["estimate", "--list-models"], capsys)
    assert code == 0
    for name in ("gpt2-xl", "gpt3-175b", "llama-3.1-405b", "mistral-7b", "qwen2.5-7b"):
        assert name in out
    assert "8.03B" in out and "sources in workbench/estimate/presets.py" in out
    code, out, _ = run(["estimate", "--list-models", "--json"], capsys)
    models = {m["name"]: m for m in json.loads(out)["models"]}
    assert models["llama-2-70b"]["n_params"] == 68_976_648_192
    assert "Touvron et al. 2023" in models["llama-2-70b"]["source"]


def test_hf_config_from_disk(tmp_path, capsys):
    config = {
        "model_type": "mistral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, _ = run(
        ["estimate", "--hf-config", str(path), "--seq-len", "4096", "--json"], capsys
    )
    d = json.loads(out)
    assert code == 0 and d["n_params"] == 7_241_732_096 and d["seq_len"] == 4096
    bad = tmp_path / "unknown.json"
    bad.write_text(json.dumps({"model_type": "no-such-model"}))
    code, out, err = run(["estimate", "--hf-config", str(bad)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    # not a family transformers knows (or, without transformers, not one counted without it)
    assert f"--hf-config {bad}: model_type 'no-such-model' is " in err
    assert "gpt2, llama, mistral, qwen2, gpt_neox" in err


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7B", 7 * 10**9),
        ("1.5e9", 1_500_000_000),
        ("175B", 175 * 10**9),
        ("350M", 350 * 10**6),
        ("1.3T", 1_300_000_000_000),
    ],
)
def test_params_as_people_write_them(text, value, capsys):
    code, out, _ = run(["estimate", "--params", text, "--json"], capsys)
    assert code == 0 and json.loads(out)["n_params"] == value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--params", "seven"],
            "--params seven: must be a whole number from 1 to 10^16 (e.g. 7B, 1.5e9",
        ),
        (["--params", "7Q"], "--params 7Q: must be a whole number from 1 to 10^16"),
        (["--model", "llama-3-8b", "--gpus", "3", "--tp", "3"], "--tp 3: must divide --heads=32"),
        (
            ["--model", "llama-3-8b", "--gpus", "16", "--tp", "16"],
            "--tp 16: must divide --kv-heads=8 evenly",
        ),
        (
            ["--model", "llama-3-8b", "--gpus", "12", "--tp", "8"],
            "--gpus 12: must be a multiple of --tp x --pp = 8",
        ),
        (["--model", "llama-3-8b", "--gpus", "5", "--pp", "5"], "--pp 5: must divide --layers=32"),
        (["--model", "gpt2", "--sequence-parallel"], "--sequence-parallel: needs --tp > 1 (got 1)"),
        (["--params", "7B", "--gpus", "8", "--tp", "8"], "--tp 8: needs a transformer shape"),
        (["--model", "bert"], "--model bert: unknown model; known: gpt2, gpt2-medium"),
        (["--model", "gpt2", "--embeddings", "sideways"], "--embeddings sideways: must be tied or"),
        (["--model", "gpt2", "--mlp", "relu"], "--mlp relu: must be one of gelu, swiglu"),
        (["--model", "gpt2", "--tp", "two"], "--tp two: must be an integer from 1 to 10^7"),
    ],
)
def test_bad_model_and_parallel_flags_exit_2_with_one_line(args, message, capsys):
    code, out, err = run(["estimate", *args], capsys)
    assert code == 2 and out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ subprocess
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_subprocess_bad_flag_exit_2_no_traceback():
    r = _cli("estimate", "--params", "1e9", "--zero", "5")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "workbench estimate: error: --zero 5: must be 0, 1, 2 or 3"
    r = _cli("estimate", "--params", "1e9", "--nonsense")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unrecognized arguments: --nonsense" in r.stderr


def test_subprocess_ok():
    r = _cli(
        "estimate",
        "--params",
        "7.5e9",
        "--precision",
        "fp16",
        "--optimizer",
        "adam",
        "--zero",
        "2",
        "--gpus",
        "64",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total_bytes"] == 15_000_000_000 + 14 * 117_187_500


def test_estimate_imports_no_torch_deepspeed_or_ipywidgets():
    code = (
        "import sys, io, contextlib\n"
        "from workbench.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['estimate', '--layers', '2', '--hidden', '64', '--heads', '4', '--seq-len',"
        " '32', '--vocab', '65', '--gpu', 'h100', '--compare-stages'])\n"
        "    main(['estimate', '--params', '1e9', '--json'])\n"
        "    main(['estimate', '--model', 'llama-3-8b', '--gpus', '16', '--tp', '8', '--pp', '2'])\n"
        "    main(['estimate', '--list-models', '--json'])\n"
        "import workbench\n"
        "workbench.estimate_memory(n_params=10)\n"
        "heavy = [m for m in ('torch', 'deepspeed', 'ipywidgets', 'pynvml', 'numpy', 'matplotlib')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_pyproject_console_script_points_at_main():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["workbench"] == "workbench.cli:main"


def test_estimate_fsdp_counts_fsdp2s_layout(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "estimate",
                "--params",
                "7.5B",
                "--precision",
                "amp-bf16",
                "--gpus",
                "64",
                "--fsdp",
                "full_shard",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["fsdp"] == "full_shard" and out["accounting"] == "fsdp"
    shard = -(-7_500_000_000 // 64)
    assert (out["params_bytes"], out["grads_bytes"], out["optimizer_bytes"]) == (
        4 * shard,
        4 * shard,
        8 * shard,
    )
    with pytest.raises(SystemExit) as info:
        main(["estimate", "--params", "7.5B", "--precision", "bf16", "--fsdp", "full_shard"])
    assert info.value.code == 2
    assert (
        "--fsdp full_shard: needs precision fp32, amp-bf16, amp-fp16 or bf16-true"
        in capsys.readouterr().err
    )


def test_the_flags_shared_with_train_config_mean_the_same_in_estimate() -> None:
    """--micro-batch, --precision, --optimizer, --zero, --fsdp and the offload flags are the
    TrainConfig settings' own flags; an offload flag takes a device here as everywhere."""
    from workbench.cli import build_parser
    from workbench.cli.config_flags import CONFIG_FLAGS

    parser, _ = build_parser("estimate")
    estimate = next(
        a
        for a in parser._subparsers._group_actions[0].choices.values()
        if a.prog.endswith("estimate")
    )
    by_flag = {opt: action for action in estimate._actions for opt in action.option_strings}
    for name in (
        "micro_batch",
        "precision",
        "optimizer",
        "zero_stage",
        "fsdp",
        "offload_optimizer",
    ):
        flag = CONFIG_FLAGS[name]
        assert by_flag[flag.flag].metavar == flag.metavar, name
    assert (
        by_flag["--offload-optimizer"].nargs == "?"
        and by_flag["--offload-optimizer"].const == "cpu"
    )


@pytest.mark.parametrize(
    ("value", "offloaded"), [([], True), (["cpu"], True), (["nvme"], True), (["none"], False)]
)
def test_an_offload_flag_takes_a_device(value, offloaded, capsys) -> None:
    from workbench.cli import main

    assert (
        main(["estimate", "--params", "1B", "--zero", "2", "--offload-optimizer", *value, "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["offload_optimizer"] is offloaded
