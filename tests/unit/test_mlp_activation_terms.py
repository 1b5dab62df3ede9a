"""The MLP's activation function in the activation formula (`workbench.estimate.
activation_functions`): what each one keeps, per layer, pinned to the tensors its autograd
saves (counted by hand from the ops each runs; tests/integration/test_activation_function_saves.py
measures the whole table), where a config names it, and what the estimate says of one it
does not know."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workbench.cli import main
from workbench.estimate import Architecture, estimate_memory, transformer_activation_bytes
from workbench.estimate.activation_functions import (
    ACTIVATION_FUNCTIONS,
    NAMES,
    config_activation,
    inner_bytes,
)
from workbench.estimate.compiled import compiled_layer_drop_bytes
from workbench.estimate.hf_config import read_hf_config
from workbench.estimate.hf_shape import config_of, family_shape
from workbench.estimate.presets import find_model
from workbench.estimate.problems import EstimateInputError

L, H, A, S, B, V = 2, 64, 4, 32, 3, 100
F = 4 * H
SBF = S * B * F


def _layer(act: str | None, e: int = 4, **kw: Any) -> int:
    shape = dict(layers=L, hidden=H, heads=A, seq_len=S, micro_batch=B, vocab=V)
    out = transformer_activation_bytes(
        **shape, activation_bytes_per_element=e, activation_function=act, **kw
    )
    return out.per_layer_bytes


# --------------------------------------------------------------------------- the formula
@pytest.mark.parametrize(
    ("act", "tensors"),
    [
        ("gelu", 2),  # F.gelu keeps its input; its output is the second matrix's input
        ("gelu_pytorch_tanh", 2),
        ("silu", 2),
        ("relu", 1),  # keeps its output only: the first matrix's output is freed
        ("sigmoid", 1),
        ("linear", 1),  # the first matrix's output is the second's input
        ("quick_gelu", 3),  # x, sigmoid(1.702x), and the product
        ("gelu_new", 5),  # x (pow), tanh(.), 0.5x, 1 + tanh(.), and the product
        ("gelu_fast", 8),  # x, 0.044715x, 0.798x, 1 + ..., the tanh's input and output, ...
        ("bloom_gelu", 2),  # BLOOM's autograd Function keeps its input only
    ],
)
def test_a_two_matrix_mlp_keeps_what_its_activation_s_autograd_keeps(act: str, tensors: int):
    # every other term is the default's: the difference is the MLP's inner tensors alone
    for e in (4, 2):
        assert _layer(act, e) - _layer("gelu", e) == (tensors - 2) * e * SBF
    assert _layer(act) == _layer(None) + (tensors - 2) * 4 * SBF


def test_gpt2_s_gelu_new_keeps_three_more_mlp_wide_tensors_than_the_paper_s_gelu():
    """Korthikanti et al.'s MLP: sbh + 2sbf elements; GPT-2's gelu_new: sbh + 5sbf."""
    sbh = S * B * H
    paper = _layer("gelu", 2, dropout=False, attention="megatron")
    assert _layer("gelu_new", 2, dropout=False, attention="megatron") - paper == 2 * 3 * SBF
    assert paper == 2 * ((2 + 5) * sbh + sbh + 2 * SBF + A * S * S * B)


@pytest.mark.parametrize(("act", "tensors"), [("silu", 4), ("relu", 3), ("gelu_new", 7)])
def test_a_gated_mlp_adds_the_up_projection_and_the_product(act: str, tensors: int) -> None:
    kw = dict(mlp="swiglu", ffn_hidden=F)
    assert _layer(act, 4, **kw) - _layer("silu", 4, **kw) == (tensors - 4) * 4 * SBF


def test_cuda_autocast_keeps_gelu_new_s_fp32_intermediates():
    """CUDA autocast runs `pow` in fp32: gelu_new keeps an fp32 copy of its input, tanh's
    fp32 output, 0.5x (16-bit), 1 + tanh (fp32) and the 16-bit cast of the fp32 product for
    the second matrix: 2 x 2 + 3 x 4 = 16 bytes per element, where pure 16-bit keeps 5 x 2.
    One-op activations keep 16-bit tensors either way."""
    assert inner_bytes("gelu_new", False, 2, autocast=True) == 16
    assert inner_bytes("gelu_new", False, 2, autocast=False) == 10
    assert inner_bytes("gelu_new", True, 2, autocast=True) == 3 * 2 + 4 * 4
    for act in ("gelu", "silu", "relu", "quick_gelu", "gelu_fast"):
        row = ACTIVATION_FUNCTIONS[act]
        assert inner_bytes(act, False, 2, autocast=True) == 2 * row.two.tensors
    # beside the MLP, autocast keeps the two norms' inputs in fp32 (the residual stream) and
    # the Q, K and V projections' own 16-bit casts of the norm's output (`implementations`)
    rest = (2 * (4 - 2) + (3 * 2 - 2)) * S * B * H
    assert _layer("gelu_new", 2, autocast=True) - _layer("gelu_new", 2) == 6 * SBF + rest
    assert _layer("gelu", 2, autocast=True) - _layer("gelu", 2) == rest
    with pytest.raises(ValueError, match="autocast=True: needs activation_bytes_per_element=2"):
        _layer("gelu_new", 4, autocast=True)


def test_the_estimate_counts_autocast_only_where_the_step_runs_under_it():
    """amp-* on the plain loop and DeepSpeed runs under autocast; FSDP's mixed-precision
    policy casts the weights and runs every op in 16 bits; bf16-true has no autocast."""
    sbf = 4 * 1024 * 3072
    mlp = {}
    for precision, fsdp in (("amp-bf16", "off"), ("amp-bf16", "full_shard"), ("bf16-true", "off")):
        gpus = 1 if fsdp == "off" else 2
        e = estimate_memory(model="gpt2", micro_batch=4, precision=precision, fsdp=fsdp, gpus=gpus)
        mlp[(precision, fsdp)] = (e.activations.mlp_inner_bytes, e.activations.autocast)
    assert mlp[("amp-bf16", "off")] == (16 * sbf, True)
    assert mlp[("amp-bf16", "full_shard")] == (10 * sbf, False)
    assert mlp[("bf16-true", "off")] == (10 * sbf, False)


def test_full_recomputation_keeps_the_layer_input_whatever_the_activation():
    kw = dict(checkpointing="full")
    assert _layer("gelu_new", **kw) == _layer("relu", **kw) == _layer("gelu", **kw)
    shape = dict(layers=L, hidden=H, heads=A, seq_len=S, micro_batch=B, vocab=V)
    shape["activation_bytes_per_element"] = 4
    working = {
        act: transformer_activation_bytes(
            **shape, checkpointing="full", activation_function=act
        ).recompute_bytes
        for act in ("gelu", "gelu_new")
    }
    assert working["gelu_new"] - working["gelu"] == 3 * 4 * SBF  # one layer, recomputed


def test_compile_recomputes_the_activation_s_pointwise_chain():
    """Inductor's partitioner keeps the first matrix's output and the second's input (the
    activation's output) and recomputes what lies between; a ReLU keeps one tensor."""
    kw = dict(
        seq_len=S, micro_batch=B, hidden=H, heads=A, ffn_hidden=F, mlp="gelu",
        attention="sdpa", checkpointing="none",
    )  # fmt: skip
    drop = {
        (act, e, cast): compiled_layer_drop_bytes(
            **kw, activation_function=act, activation_bytes_per_element=e, autocast=cast
        )
        for act in ("gelu", "gelu_new", "relu", "quick_gelu")
        for e, cast in ((4, False), (2, False), (2, True))
    }
    assert drop[("gelu", 4, False)] == drop[("relu", 4, False)] == 0
    assert drop[("gelu_new", 4, False)] == 3 * 4 * SBF
    assert drop[("gelu_new", 2, True)] == (16 - 2 * 2) * SBF  # its fp32 chain, recomputed
    assert drop[("quick_gelu", 2, False)] == 2 * SBF
    swiglu = compiled_layer_drop_bytes(
        **{**kw, "mlp": "swiglu"}, activation_bytes_per_element=4, activation_function="silu"
    )
    assert swiglu == 4 * SBF  # the SiLU output, as before


# --------------------------------------------------------------------------- the field
def test_the_default_is_the_mlp_s_one_op_activation_and_follows_a_change_of_mlp():
    gelu = Architecture.create(layers=L, hidden=H, heads=A, seq_len=S, vocab=V)
    assert gelu.activation_function == "gelu"
    swiglu = gelu.replace(mlp="swiglu")
    assert swiglu.activation_function == "silu"
    relu = gelu.replace(activation_function="relu")
    assert relu.replace(mlp="swiglu").activation_function == "relu"  # named: kept
    assert relu.n_params == gelu.n_params  # the activation changes no parameter
    assert find_model("gpt2").architecture.activation_function == "gelu_new"
    assert find_model("gpt2-xl").architecture.activation_function == "gelu_new"
    assert find_model("gpt3-175b").architecture.activation_function == "gelu"  # Megatron's
    assert find_model("llama-2-7b").architecture.activation_function == "silu"


def test_an_unknown_activation_given_is_refused_with_the_names_known():
    shape = dict(layers=L, hidden=H, heads=A, seq_len=S, vocab=V)
    with pytest.raises(EstimateInputError, match="activation_function='geluu': must be one of"):
        Architecture.create(**shape, activation_function="geluu")
    with pytest.raises(
        ValueError, match=r"activation_function='geluu': must be one of gelu, "
    ) as e:
        estimate_memory(**shape, activation_function="geluu")
    assert "gelu_new" in str(e.value) and "relu" in str(e.value)
    with pytest.raises(ValueError, match="activation_function='x': must be one of gelu, "):
        transformer_activation_bytes(
            layers=L, hidden=H, heads=A, seq_len=S, micro_batch=B, vocab=V,
            activation_function="x",
        )  # fmt: skip
    assert estimate_memory(**shape, activation_function=" GELU_New ").activation_function == (
        "gelu_new"
    )


def test_the_table_names_every_activation_once():
    assert len(NAMES) == len(set(NAMES)) == len(ACTIVATION_FUNCTIONS)
    for row in ACTIVATION_FUNCTIONS.values():
        for kept, inner in ((row.two, 1), (row.gated, 3)):
            # the second (down) matrix's input at least; the gated MLP's up and product
            assert kept.tensors >= inner and sum(kept.autocast) >= kept.tensors


# --------------------------------------------------------------------------- configs
def _gpt2(**extra: Any) -> dict[str, Any]:
    return {"model_type": "gpt2", "n_layer": L, "n_embd": H, "n_head": A, "vocab_size": V,
            "n_positions": S, **extra}  # fmt: skip


def test_a_config_names_the_activation_under_its_family_s_key():
    fields, _ = read_hf_config(_gpt2())
    assert fields["activation_function"] == "gelu_new"  # GPT2Config's default
    fields, _ = read_hf_config(_gpt2(activation_function="gelu_pytorch_tanh"))
    assert fields["activation_function"] == "gelu_pytorch_tanh"
    llama = {"model_type": "llama", "num_hidden_layers": L, "hidden_size": H,
             "num_attention_heads": A, "intermediate_size": F, "vocab_size": V,
             "max_position_embeddings": S}  # fmt: skip
    assert read_hf_config(llama)[0]["activation_function"] == "silu"
    assert read_hf_config({**llama, "hidden_act": "gelu"})[0]["activation_function"] == "gelu"
    neox = {**llama, "model_type": "gpt_neox"}
    assert read_hf_config(neox)[0]["activation_function"] == "gelu"


@pytest.mark.parametrize(
    ("model_type", "key", "value"),
    [
        ("opt", "activation_function", "relu"),
        ("gptj", "activation_function", "gelu_new"),
        ("gpt_bigcode", "activation_function", "gelu_pytorch_tanh"),
        ("phi", "hidden_act", "gelu_new"),
        ("bert", "hidden_act", "gelu"),
        ("falcon", "activation", "gelu"),
        ("starcoder2", "hidden_act", "gelu_pytorch_tanh"),
        ("gemma2", "hidden_activation", "gelu_pytorch_tanh"),
        ("bloom", None, "bloom_gelu"),
    ],
)
def test_each_mapped_family_reads_the_key_its_modeling_code_reads(model_type, key, value):
    """The resolved configs transformers builds (every default filled in), read without
    building: the key each family's MLP reads (`ACT2FN[config.<key>]`)."""
    config = {
        "model_type": model_type, "num_hidden_layers": L, "hidden_size": H,
        "num_attention_heads": A, "intermediate_size": F, "vocab_size": V,
        "max_position_embeddings": S, "n_inner": F, "ffn_dim": F, "ffn_hidden_size": F,
        "hidden_act": "silu",  # what a family that reads another key ignores
    }  # fmt: skip
    if key is not None:
        config[key] = value
    shape = family_shape(config, None)
    assert shape.fields["activation_function"] == value
    assert shape.activation_function_note is None


def test_a_config_s_unknown_activation_is_estimated_as_the_mlp_s_default_and_said():
    config = _gpt2(activation_function="my_act")
    e = estimate_memory(hf_config=config, micro_batch=2)
    assert e.activation_function == "gelu" and e.activation_bytes is not None
    assert e.activation_function_note == (
        "activation_function 'my_act' is not an activation the estimator knows: its MLP is "
        "counted with gelu (one op that keeps its input); a dry run (--simulate) measures it"
    )
    assert "assumed" in str(e) and "'my_act'" in str(e)
    named = estimate_memory(hf_config=config, micro_batch=2, activation_function="relu")
    assert named.activation_function == "relu" and named.activation_function_note is None
    # a value of another JSON type, and a family read by building (its resolved config)
    _, note = config_activation({"hidden_act": {"a": 1}}, "llama", "swiglu")
    assert note is not None and note.startswith("hidden_act {'a': 1} is not an activation")
    shape = family_shape({**_gpt2(), "model_type": "phi", "hidden_act": "xyz",
                          "num_hidden_layers": L, "hidden_size": H, "num_attention_heads": A,
                          "vocab_size": V, "max_position_embeddings": S}, None)  # fmt: skip
    assert shape.fields["activation_function"] == "gelu"
    assert "hidden_act 'xyz'" in str(shape.activation_function_note)


def test_the_command_line_names_the_activation_and_the_assumption(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_gpt2(activation_function="my_act")))
    assert main(["estimate", "--hf-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gelu MLP 256 with gelu" in out
    assert "note: activation_function 'my_act' is not an activation the estimator knows" in out
    assert main(["estimate", "--model", "gpt2", "--activation-function", "relu"]) == 0
    assert "gelu MLP 3072 with relu" in capsys.readouterr().out
    assert main(["estimate", "--model", "gpt2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["activation_function"] == "gelu_new"
    assert data["activations"]["mlp_inner_bytes"] == 5 * 4 * 1024 * 3072  # fp32, b 1


def test_a_shape_s_dry_run_config_names_its_activation():
    """`config_of` (the dry run's model of a preset or a shape) builds the activation the
    shape names: GPT-2's presets run transformers' gelu_new."""
    gpt2 = config_of(find_model("gpt2").architecture)
    assert gpt2 is not None and gpt2["activation_function"] == "gelu_new"
    llama = config_of(find_model("llama-2-7b").architecture)
    assert llama is not None and llama["hidden_act"] == "silu"
    shape = Architecture.create(layers=L, hidden=H, heads=A, seq_len=S, vocab=V)
    relu = config_of(shape.replace(activation_function="relu"))
    assert relu is not None and relu["activation_function"] == "relu"
    bloom = config_of(shape.replace(activation_function="bloom_gelu"))
    assert bloom is not None and bloom["activation_function"] == "gelu_pytorch_tanh"
