"""`workbench estimate` as a user reviewing its command line read it: the rate its time
assumes named as what it is (HFU, with the MFU beside it), implementations an optimizer
does not have refused, one error for a refused config file, conflicting flags refused,
and every allowed value listed."""

from __future__ import annotations

import pytest

from workbench.cli import main
from workbench.estimate import estimate_memory


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error(argv: list[str], capsys) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err.strip()


# ---------------------------------------------------------------- the rate the time assumes
LLAMA_RUN = ["--model", "llama-3-8b", "--precision", "bf16", "--zero", "3", "--gpus", "8"]
LLAMA_RUN += ["--tokens", "1e12", "--gpu", "h100"]


def test_with_recomputation_the_rate_is_said_as_hfu_with_the_mfu_beside_it(capsys):
    code, out, _ = run([*LLAMA_RUN, "--checkpointing", "full"], capsys)
    assert code == 0
    line = next(s for s in out.splitlines() if s.startswith("compute:"))
    # 282.3 days is 7.72e22 FLOPs at 0.4 of the peak: 0.4 is the HFU; 0.4 x 5.79/7.72 the MFU
    assert "282.3 days on 8 x h100-80gb at HFU 0.40 (MFU 0.30)" in line, line
    assert "at MFU 0.4" not in line


def test_without_recomputation_the_rate_is_the_mfu(capsys):
    code, out, _ = run(LLAMA_RUN, capsys)
    assert code == 0
    assert "on 8 x h100-80gb at MFU 0.4" in out
    assert "HFU" not in out


def test_the_mfu_is_the_rate_times_model_over_hardware_flops():
    e = estimate_memory(
        model="llama-3-8b", tokens=1e12, gpu="h100", gpus=8, zero_stage=3, checkpointing="full"
    )
    assert e.model_flops is not None and e.train_flops is not None
    assert e.model_flops_utilisation == pytest.approx(0.4 * e.model_flops / e.train_flops)
    assert e.model_flops_utilisation == pytest.approx(0.30, abs=0.005)
    plain = estimate_memory(model="llama-3-8b", tokens=1e12, gpu="h100", gpus=8, zero_stage=3)
    assert plain.model_flops_utilisation == pytest.approx(0.4)


def test_a_parameter_count_prints_its_model_flops_before_the_recomputed_ones(capsys):
    args = ["--params", "7B", "--precision", "bf16", "--tokens", "1e12", "--gpu", "h100"]
    code, out, _ = run([*args, "--checkpointing", "full"], capsys)
    assert code == 0
    line = next(s for s in out.splitlines() if s.startswith("compute:"))
    assert "6 x params x tokens = 4.2e+22 FLOPs, 5.6e+22 with the full recomputation" in line
    assert "at HFU 0.40 (MFU 0.30)" in line


def test_the_mfu_flag_says_it_is_applied_to_the_hardware_flops(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    assert "hardware FLOP utilisation (HFU)" in text


# ---------------------------------------------------------------- optimizer implementations
@pytest.mark.parametrize(
    ("optimizer", "impl", "allowed"),
    [
        ("adafactor", "fused", "auto, foreach, for-loop"),  # torch's Adafactor: foreach= only
        ("lamb", "foreach", "auto, fused"),  # DeepSpeed's FusedLamb: a fused kernel only
        ("adam8bit", "for-loop", "auto, fused"),
    ],
)
def test_an_implementation_the_optimizer_lacks_is_refused_naming_both(optimizer, impl, allowed):
    from workbench.estimate import EstimateInputError

    with pytest.raises(EstimateInputError) as info:
        estimate_memory(n_params="7B", optimizer=optimizer, optimizer_impl=impl)
    (problem,) = info.value.problems
    assert problem.field == "optimizer_impl" and problem.value == impl
    assert optimizer in problem.message and problem.message.endswith(f"one of {allowed}")


@pytest.mark.parametrize(
    ("optimizer", "impl"),
    [("adamw", "fused"), ("adagrad", "fused"), ("adafactor", "foreach"), ("lamb", "fused")],
)
def test_an_implementation_the_optimizer_has_is_taken(optimizer, impl):
    assert estimate_memory(n_params="7B", optimizer=optimizer, optimizer_impl=impl).optimizer_impl


def test_the_rows_implementations_are_what_torch_takes():
    import inspect

    import torch

    from workbench.optimizers import ROWS

    for name, cls in (("adamw", "AdamW"), ("adam", "Adam"), ("sgd", "SGD"), ("adagrad", "Adagrad")):
        assert "fused" in inspect.signature(getattr(torch.optim, cls)).parameters
        assert "fused" in ROWS[name].implementations
    assert "fused" not in inspect.signature(torch.optim.Adafactor).parameters
    assert ROWS["adafactor"].implementations == ("foreach", "for-loop")


def test_the_cli_names_the_flags_of_an_implementation_the_optimizer_lacks(capsys):
    err = one_error(
        ["--params", "7B", "--optimizer", "adafactor", "--optimizer-impl", "fused"], capsys
    )
    assert err.endswith(
        "error: --optimizer-impl fused: --optimizer adafactor has no fused kernel: "
        "must be one of auto, foreach, for-loop"
    ), err


# ---------------------------------------------------------------- a refused config.json alone
LLAMA_KEYS = (
    '"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2, '
    '"num_attention_heads": 32, "vocab_size": 1000, "intermediate_size": 11008, '
    '"max_position_embeddings": 2048'
)
BAD_CONFIGS = {
    "a key twice": "{" + LLAMA_KEYS + ', "hidden_size": 4096}',
    "a string for a bool": "{" + LLAMA_KEYS + ', "tie_word_embeddings": "false"}',
    "4.0 layers": "{"
    + LLAMA_KEYS.replace('"num_hidden_layers": 2', '"num_hidden_layers": 4.0')
    + "}",
    "true layers": "{"
    + LLAMA_KEYS.replace('"num_hidden_layers": 2', '"num_hidden_layers": true')
    + "}",
    "too deep": '{"a": ' + "[" * 100 + "]" * 100 + "}",
}
DEPENDENT_FLAGS = [
    ["--seq-len", "2048"],
    ["--hidden", "512"],
    ["--lora-rank", "8"],
    ["--lora-rank", "8", "--qlora"],
    ["--cp", "2", "--gpus", "2"],
    ["--tp", "2", "--gpus", "2"],
]


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("extra", DEPENDENT_FLAGS, ids=" ".join)
def test_a_refused_config_is_the_one_error(case, extra, tmp_path, capsys):
    (tmp_path / "config.json").write_text(BAD_CONFIGS[case])
    alone = one_error(["--hf-config", str(tmp_path)], capsys)
    assert f"--hf-config {tmp_path}: " in alone
    assert one_error(["--hf-config", str(tmp_path), *extra], capsys) == alone


def test_a_refused_config_still_lets_other_bad_flags_be_named(tmp_path, capsys):
    (tmp_path / "config.json").write_text(BAD_CONFIGS["a key twice"])
    err = one_error(["--hf-config", str(tmp_path), "--seq-len", "2048", "--zero", "7"], capsys)
    assert err.endswith(
        "appears twice in one object (which one is meant?); --zero 7: must be 0, 1, 2 or 3"
    )


def test_the_api_reports_a_refused_config_or_preset_alone(tmp_path):
    from workbench.estimate import EstimateInputError

    (tmp_path / "config.json").write_text(BAD_CONFIGS["a key twice"])
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config=str(tmp_path), seq_len=2048, lora_rank=8)
    assert [p.field for p in info.value.problems] == ["hf_config"]
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(model="no-such-model", seq_len=2048, gpus=2, context_parallel=2)
    assert [p.field for p in info.value.problems] == ["model"]
    with pytest.raises(EstimateInputError) as info:  # no model at all: the shape is asked
        estimate_memory(seq_len=2048)
    assert "layers" in {p.field for p in info.value.problems}


# ---------------------------------------------------------------- flags that say two things
def test_a_model_with_params_is_refused_naming_both(tmp_path, capsys):
    err = one_error(["--model", "gpt2", "--params", "7B"], capsys)
    assert err.endswith(
        "error: --model gpt2 and --params 7B: give one (the model counts its "
        "own parameters; the shape flags change its shape)"
    ), err
    (tmp_path / "config.json").write_text("{" + LLAMA_KEYS + "}")
    err = one_error(["--hf-config", str(tmp_path), "--params", "7B"], capsys)
    assert f"--hf-config {tmp_path} and --params 7B: give one" in err
    code, out, _ = run(
        [
            "--params",
            "7B",
            "--layers",
            "32",
            "--hidden",
            "4096",
            "--heads",
            "32",
            "--seq-len",
            "2048",
            "--vocab",
            "32000",
        ],
        capsys,
    )
    assert code == 0 and out.startswith("7B parameters")  # a count with a bare shape: taken


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--model", "gpt2", "--activation-checkpointing", "--checkpointing", "selective"],
            "--activation-checkpointing (bare: full) and --checkpointing selective: one setting "
            "given two values (--checkpointing: the old spelling of --activation-checkpointing)",
        ),
        (
            ["--model", "llama-3-8b", "--gpus", "8", "--cp", "2", "--context-parallel", "4"],
            "--cp 2 and --context-parallel 4: one setting given two values "
            "(--context-parallel: the old spelling of --cp)",
        ),
    ],
)
def test_an_old_spelling_beside_its_new_one_with_another_value_is_refused(args, said, capsys):
    assert one_error(args, capsys).endswith(f"error: {said}; give one")


@pytest.mark.parametrize(
    ("args", "headline"),
    [
        (
            ["--model", "gpt2", "--activation-checkpointing", "--checkpointing", "FULL"],
            "checkpointing full",
        ),
        (["--model", "llama-3-8b", "--gpus", "8", "--cp", "2", "--context-parallel", "2"], "cp 2"),
        (["--model", "llama-3-8b", "--gpus", "8", "--cp", "2", "--cp", "4"], "cp 4"),  # last wins
    ],
)
def test_spellings_that_agree_are_taken(args, headline, capsys):
    code, out, _ = run(args, capsys)
    assert code == 0 and headline in out.splitlines()[0]


# ---------------------------------------------------------------- every allowed value
def test_a_bad_attention_kernel_lists_every_value_the_flag_takes(capsys):
    err = one_error(["--model", "gpt2", "--attention", "flash"], capsys)
    assert err.endswith(
        "error: --attention flash: must be one of model, sdpa, megatron, eager, math"
    )
    for kernel in ("model", " Model ", "sdpa", "EAGER", "megatron", "math"):  # each is taken
        code, _, err = run(["--model", "gpt2", "--attention", kernel], capsys)
        assert code == 0, (kernel, err)


# ------------------------------------------- DeepSpeed's own layout beside the paper's count
def test_a_deepspeed_setup_whose_layout_holds_more_says_deepspeeds_figures(capsys):
    # fp32 ZeRO-2: DeepSpeed keeps an fp32 master partition beside the fp32 weights, which
    # the ZeRO paper's accounting (the report's figures) does not count
    argv = ["--model", "gpt2", "--seq-len", "128", "--micro-batch", "1", "--zero", "2"]
    code, out, _ = run([*argv, "--gpus", "2"], capsys)
    assert code == 0
    engine = estimate_memory(
        model="gpt2", seq_len=128, micro_batch=1, zero_stage=2, gpus=2, accounting="deepspeed"
    )
    paper = estimate_memory(model="gpt2", seq_len=128, micro_batch=1, zero_stage=2, gpus=2)
    assert engine.peak_bytes > 1.1 * paper.peak_bytes
    note = next(s for s in out.splitlines() if "DeepSpeed's engine lays" in s)
    assert f"peak of a step {engine.peak_bytes / 2**30:.2f} GiB" in note
    assert f"(here {paper.peak_bytes / 2**30:.2f})" in note
    # DeepSpeed's bf16 ZeRO-2 on 8 GPUs: both count the same master copy; no note
    code, out, _ = run([*LLAMA_RUN[:4], "--zero", "2", "--gpus", "8"], capsys)
    assert code == 0 and "DeepSpeed's engine lays" not in out
