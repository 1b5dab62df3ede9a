"""`workbench estimate --simulate` with a preset of each transformers family: the model is
built from the preset's config.json on fake tensors (one layer or two, a short sequence:
the family's model classes run, cheaply)."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main

#: One preset per family, and the transformers class its blocks are.
FAMILIES = {
    "gpt2": "GPT2Block",
    "llama-2-7b": "LlamaDecoderLayer",
    "mistral-7b": "MistralDecoderLayer",
    "qwen2.5-7b": "Qwen2DecoderLayer",
    "pythia-1.4b": "GPTNeoXLayer",
}


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("preset", sorted(FAMILIES))
def test_a_preset_of_each_family_dry_runs(preset: str, capsys) -> None:
    args = ["estimate", "--model", preset, "--layers", "1", "--seq-len", "16"]
    code, out, err = _run([*args, "--micro-batch", "1", "--simulate", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    dry, formula = data["dry_run"], data["estimate"]
    assert dry["params_bytes"] == formula["params_bytes"]
    assert dry["peak_bytes"] > dry["params_bytes"]
    assert dry["seq_len"] == 16 and dry["micro_batch"] == 1
    assert any(FAMILIES[preset] in n for n in dry["notes"])
    assert dry["dtypes"]["parameters"] == "fp32"


def test_a_shape_dry_runs_as_a_llama(capsys) -> None:
    args = ["estimate", "--layers", "1", "--hidden", "64", "--heads", "4", "--seq-len", "16"]
    code, out, err = _run([*args, "--vocab", "128", "--simulate", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["dry_run"]["n_params"] > 0


def test_the_gpt2_preset_dry_runs_gpt2_s_gelu_new(capsys) -> None:
    """The GPT-2 preset's model runs its config.json's activation, transformers' Python
    `gelu_new` (hf_shape.config_of), and the formula counts its tensors: with a one-op GELU
    (`--activation-function gelu_pytorch_tanh`) the dry run and the formula drop by the
    same bytes at the forward end, 3 MLP-wide fp32 tensors per layer."""
    layers, b, s, f = 2, 2, 64, 3072
    args = ["estimate", "--model", "gpt2", "--layers", str(layers), "--seq-len", str(s)]
    ends = {}
    for act in ("gelu_new", "gelu_pytorch_tanh"):
        flags = ["--micro-batch", str(b), "--activation-function", act, "--simulate", "--json"]
        code, out, err = _run([*args, *flags], capsys)
        assert code == 0, err
        data = json.loads(out)
        assert data["estimate"]["activation_function"] == act
        formula = sum(data["estimate"]["peak"]["points"]["forward end"].values())
        ends[act] = (data["dry_run"]["phases"]["forward end"], formula)
    dry = ends["gelu_new"][0] - ends["gelu_pytorch_tanh"][0]
    formula = ends["gelu_new"][1] - ends["gelu_pytorch_tanh"][1]
    assert dry == formula == layers * 3 * 4 * b * s * f
