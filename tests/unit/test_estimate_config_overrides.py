"""Shape keywords given with a config.json that is counted by building its model (any
family but the five read without transformers): the model is built with them set at the
family's keys, so the count, the shape and the header agree; a keyword no key sets is
refused naming it and what to edit."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.estimate import EstimateInputError, estimate_memory

MIXTRAL = {
    "model_type": "mixtral",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 100,
    "max_position_embeddings": 256,
}
BERT = {
    "model_type": "bert",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 100,
    "max_position_embeddings": 128,
}
T5 = {
    "model_type": "t5",
    "d_model": 64,
    "d_ff": 128,
    "d_kv": 16,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "vocab_size": 100,
    "is_encoder_decoder": True,
}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_layers_given_with_a_built_config_count_the_model_of_that_depth():
    base = estimate_memory(hf_config=MIXTRAL)
    deeper = estimate_memory(hf_config=MIXTRAL, layers=8)
    edited = estimate_memory(hf_config={**MIXTRAL, "num_hidden_layers": 8})
    assert deeper.layers == 8 and base.layers == 2
    assert deeper.n_params == edited.n_params > base.n_params
    assert deeper.active_params == edited.active_params
    assert deeper.activation_bytes == edited.activation_bytes


def test_every_mapped_keyword_reaches_the_built_model():
    got = estimate_memory(hf_config=MIXTRAL, hidden=128, heads=8, kv_heads=4, vocab=200)
    keys = {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 4}
    same = estimate_memory(hf_config={**MIXTRAL, **keys, "vocab_size": 200})
    assert got.n_params == same.n_params
    assert (got.hidden, got.heads, got.kv_heads, got.vocab) == (128, 8, 4, 200)
    bert = estimate_memory(hf_config=BERT, layers=4, ffn_hidden=256)
    built = estimate_memory(hf_config={**BERT, "num_hidden_layers": 4, "intermediate_size": 256})
    assert bert.n_params == built.n_params and bert.ffn_hidden == 256


def test_a_config_without_a_shape_takes_the_keys_it_has():
    wider = estimate_memory(hf_config=T5, hidden=128)
    assert wider.n_params == estimate_memory(hf_config={**T5, "d_model": 128}).n_params
    assert wider.n_params > estimate_memory(hf_config=T5).n_params


def test_a_layout_keyword_is_refused_naming_it():
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config=MIXTRAL, mlp="gelu")
    (problem,) = info.value.problems
    assert problem.field == "mlp" and "model_type decides" in problem.message


def test_an_encoder_decoders_layers_are_refused_naming_its_keys():
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config=T5, layers=4)
    (problem,) = info.value.problems
    assert problem.field == "layers"
    assert "num_layers, num_decoder_layers" in problem.message


def test_the_command_line_counts_the_overridden_model(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    code, two, _ = run(["--hf-config", str(path)], capsys)
    code8, eight, _ = run(["--hf-config", str(path), "--layers", "8"], capsys)
    assert code == code8 == 0
    assert two.splitlines()[0] != eight.splitlines()[0]  # the count in the header moved
    assert "shape: 8 layers" in eight
    path.write_text(json.dumps({**MIXTRAL, "num_hidden_layers": 8}))
    _, edited, _ = run(["--hf-config", str(path)], capsys)
    assert edited.splitlines()[0] == eight.splitlines()[0]
    code, out, err = run(["--hf-config", str(path), "--norm", "layernorm"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--norm layernorm:" in err


def test_a_built_config_takes_the_activation_at_its_family_s_key(capsys):
    """`activation_function` is set at the key the family's code reads (BERT's `hidden_act`)
    and the model built so; a family whose code runs its own (BLOOM) has no key to set, and
    a name transformers does not run cannot be built: both refused naming the keyword."""
    relu = estimate_memory(hf_config=BERT, activation_function="relu")
    edited = estimate_memory(hf_config={**BERT, "hidden_act": "relu"})
    assert relu.activation_function == edited.activation_function == "relu"
    assert relu.activation_bytes == edited.activation_bytes
    assert relu.activation_bytes < estimate_memory(hf_config=BERT).activation_bytes
    bloom = {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4,
             "vocab_size": 100}  # fmt: skip
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config=bloom, activation_function="relu")
    (problem,) = info.value.problems
    assert problem.field == "activation_function" and "no key that names its MLP" in problem.message
    with pytest.raises(
        EstimateInputError, match="activation_function='bloom_gelu': must be one of"
    ):
        estimate_memory(hf_config=BERT, activation_function="bloom_gelu")
    assert estimate_memory(hf_config=bloom).activation_function == "bloom_gelu"
