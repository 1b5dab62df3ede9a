"""A config.json's dtype (`torch_dtype`, or `dtype` as transformers 5 writes it): the
precision decides what is counted, and `workbench estimate` says so when the config names
16-bit weights at a precision that trains fp32 ones; a dtype that is none is refused
naming its key."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.estimate import EstimateInputError, estimate_memory, read_hf_config

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "max_position_embeddings": 128,
}
GEMMA = {**LLAMA, "model_type": "gemma", "head_dim": 16, "num_key_value_heads": 1}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def saved(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_bf16_config_at_fp32_is_said_to_be_counted_in_fp32(tmp_path, capsys, key):
    path = saved(tmp_path, {**LLAMA, key: "bfloat16"})
    code, out, _ = run(["--hf-config", path], capsys)
    assert code == 0
    (note,) = [line for line in out.splitlines() if line.startswith("note: ")]
    assert "bfloat16 weights" in note and "--precision fp32 trains fp32 weights" in note
    code, out, _ = run(["--hf-config", path, "--precision", "bf16-true"], capsys)
    assert code == 0 and "note: " not in out
    code, out, _ = run(["--hf-config", path, "--json"], capsys)
    assert len(json.loads(out)["notes"]) == 1


def test_an_fp32_config_has_no_note(tmp_path, capsys):
    code, out, _ = run(["--hf-config", saved(tmp_path, {**LLAMA, "dtype": "float32"})], capsys)
    assert code == 0 and "note: " not in out


@pytest.mark.parametrize("value", ["int7", 5, "bf16", True])
@pytest.mark.parametrize("base", [LLAMA, GEMMA], ids=["read", "built"])
def test_a_dtype_that_is_none_is_refused_naming_the_key(value, base):
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config={**base, "torch_dtype": value})
    (problem,) = info.value.problems
    assert problem.field == "hf_config"
    assert problem.message.startswith(f"torch_dtype {value!r}")
    assert "float32, float16, bfloat16" in problem.message


def test_the_pure_reader_refuses_it_too():
    _, problems = read_hf_config({**LLAMA, "dtype": "int7"})
    assert [p.message.split(":")[0] for p in problems] == ["dtype 'int7'"]


def test_a_module_and_the_function_that_builds_it_train_with_the_same_dropout() -> None:
    """The dropout a module's own config gives (a Llama's attention_dropout 0.0) is read
    from a module given and from one a function builds alike."""
    import warnings

    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench import estimate_memory

    warnings.filterwarnings("ignore")
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, vocab_size=256, max_position_embeddings=128)  # fmt: skip
    built = estimate_memory(model=lambda: LlamaForCausalLM(cfg), seq_len=128)
    given = estimate_memory(model=LlamaForCausalLM(cfg), seq_len=128)
    assert built.dropout is False and given.dropout is False
    assert built.activation_bytes == given.activation_bytes
