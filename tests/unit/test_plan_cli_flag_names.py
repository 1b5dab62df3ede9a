"""`workbench plan` says its errors with its flags, one line a problem, as `workbench
estimate` does; plan() keeps the Python keywords."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main
from workbench.planner import plan


def _err(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["plan", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and all(line.startswith("workbench plan: error: ") for line in lines)
    return [line[len("workbench plan: error: ") :] for line in lines]


def test_the_models_errors_name_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _err(capsys, "--model", "llama-3-8bb")[0].startswith(
        "--model llama-3-8bb: unknown model; did you mean llama-3-8b?"
    )
    empty = tmp_path / "X.json"
    empty.write_text("{}", encoding="utf-8")
    assert _err(capsys, "--hf-config", str(empty))[0].startswith(
        f"--hf-config {empty}: model_type None is not supported"
    )
    assert _err(capsys, "--params", "7B") == [
        "--params 7B: the planner needs the model's shape (layers, hidden, heads): give a "
        "preset or a module (--model), a config.json (--hf-config), or --layers, --hidden, "
        "--heads with --params"
    ]
    assert _err(capsys)[0].startswith("--params is missing: give --params, a --model")
    assert _err(capsys, "--model", "llama-3-8b", "--heads", "7") == [
        "--heads 7: must divide --hidden=4096 evenly",
        "--kv-heads 8: must divide --heads=7 evenly",
    ]
    float8 = _err(capsys, "--model", "llama-3-8b", "--gpu", "a100-80gb", "--float8")
    assert float8[0].startswith("--float8: no published float8 training speedup for a100-80gb")
    for line in float8:
        assert "=" not in line.split(":")[0]


def test_a_model_and_a_parameter_count_are_refused_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `workbench estimate` refuses them: the preset counts its own parameters, so a
    --params beside it would plan a model that is neither."""
    assert _err(capsys, "--model", "llama-3-8b", "--params", "7B") == [
        "--model llama-3-8b and --params 7B: give one (the model counts its own parameters; "
        "the shape flags change its shape)"
    ]
    config = tmp_path / "config.json"
    config.write_text("{}", encoding="utf-8")
    assert _err(capsys, "--hf-config", str(config), "--params", "7B")[0].startswith(
        f"--hf-config {config} and --params 7B: give one"
    )


def test_python_keeps_the_keywords() -> None:
    with pytest.raises(ValueError, match=r"or layers=, hidden=, heads= with n_params="):
        plan(n_params="7B")
    with pytest.raises(ValueError, match="float8=True: no published float8"):
        plan(model="llama-3-8b", gpu="a100-80gb", float8=True)


def test_more_nodes_is_said_as_the_flag_on_the_cli_and_the_keyword_in_python(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (line,) = _err(capsys, "--model", "llama-3-8b", "--headroom", "0.99")
    assert line.startswith("--model llama-3-8b: none of the ")
    assert line.endswith("more GPUs (--nodes), a larger GPU, or LoRA")
    with pytest.raises(ValueError, match=r"more GPUs \(nodes=\), a larger GPU"):
        plan(model="llama-3-8b", headroom=0.99)


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--mfu", "-0.1", "must be a finite number from 0.001 to 1"),
        ("--mfu", "0", "must be a finite number from 0.001 to 1"),
        ("--mfu", "0.0001", "must be a finite number from 0.001 to 1"),
        ("--mfu", "1.5", "more than 1 (a utilisation is a fraction of the peak rate); allowed: "
         "a finite number from 0.001 to 1"),
        ("--efficiency", "0", "must be a finite number from 0.001 to 1"),
        ("--headroom", "-0.5", "must be a number >= 0 and < 1"),
        ("--headroom", "1", "must be a number >= 0 and < 1"),
        ("--inter-node-gbps", "1e400", "must be a number of GB/s from 0.001 to 10^6"),
        ("--intra-node-gbps", "0", "must be a number of GB/s from 0.001 to 10^6"),
        ("--inter-node-gbps", "1e7", "must be a number of GB/s from 0.001 to 10^6"),
    ],
)  # fmt: skip
def test_a_number_out_of_range_is_said_with_its_whole_range(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, said: str
) -> None:
    assert _err(capsys, "--model", "llama-3-8b", flag, value) == [f"{flag} {value}: {said}"]


@pytest.mark.parametrize("mfu", [0, 0.0001, 1.5, True])
def test_plan_states_the_one_range_of_mfu(mfu: object) -> None:
    with pytest.raises(ValueError, match=r"mfu=.*allowed: a finite number from 0.001 to 1$|"
                       r"mfu=.*: must be a finite number from 0.001 to 1$"):  # fmt: skip
        plan(model="llama-3-8b", mfu=mfu)


#: every refusal about the price: (the value plan() is given, the CLI's text, the tokens, why)
PRICE_REFUSALS = [
    (-1.0, "-1", "1T", "must be a finite number from 0 to 10^6"),
    (float("nan"), "nan", "1T", "must be a finite number from 0 to 10^6"),
    (float("inf"), "inf", "1T", "must be a finite number from 0 to 10^6"),
    (1e7, "1e7", "1T", "more than 10^6 per GPU-hour"),
    (2.5, "2.5", None, "the cost is of training the tokens; give"),
]


@pytest.mark.parametrize(("value", "text", "tokens", "why"), PRICE_REFUSALS)
@pytest.mark.parametrize("keyword", ["price_per_gpu_hour", "price"])
def test_every_price_refusal_names_the_keyword_the_caller_gave(
    keyword: str, value: float, text: str, tokens: str | None, why: str
) -> None:
    """plan() takes the price as price_per_gpu_hour= or by the command's name, price=; its
    refusals name the one given."""
    kw = {keyword: value, **({"tokens": tokens} if tokens else {})}
    with pytest.raises(ValueError, match=rf"^{keyword}={value!r}: ") as got:
        plan(model="llama-3-8b", gpus=8, **kw)
    assert why in str(got.value)
    if keyword == "price":
        assert "price_per_gpu_hour" not in str(got.value)
    if tokens is None:
        assert "give tokens= too" in str(got.value)


@pytest.mark.parametrize(("value", "text", "tokens", "why"), PRICE_REFUSALS)
def test_every_price_refusal_names_the_flag_and_the_value_as_typed(
    capsys: pytest.CaptureFixture[str], value: float, text: str, tokens: str | None, why: str
) -> None:
    more = ["--tokens", tokens] if tokens else []
    (line,) = _err(capsys, "--model", "llama-3-8b", "--gpus", "8", "--price", text, *more)
    assert line.startswith(f"--price {text}: {why}")
    assert "price_per_gpu_hour" not in line and "=" not in line.split(":")[0]
    if tokens is None:
        assert "give --tokens too" in line


def test_tokens_out_of_range_are_said_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = _err(capsys, "--model", "llama-3-8b", "--tokens", "1e30", "--price", "2")
    assert line.startswith("--tokens 1e30: more than 10^16 tokens")
