"""`workbench estimate` errors name what the user gave: a config.json's own values by
the file and its keys, a config or module without a shape by why it has none, never a
flag that was not given; a config may leave max_position_embeddings out when --seq-len
is given."""

from __future__ import annotations

import json

import pytest

from workbench.cli import main
from workbench.estimate import EstimateInputError, estimate_memory

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
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 256,
}


def error(argv: list[str], capsys) -> str:
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, out, err)
    return err.strip()


def saved(tmp_path, config: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_a_config_without_a_shape_takes_seq_len(tmp_path, capsys):
    path = saved(tmp_path, T5)
    assert main(["estimate", "--hf-config", path, "--seq-len", "128"]) == 0
    out = capsys.readouterr().out
    assert "T5ForConditionalGeneration" in out and "encoder-decoder" in out
    e = estimate_memory(hf_config=T5, seq_len=128)
    assert e.activation_bytes is None and "encoder-decoder" in (e.activation_note or "")


def test_a_module_without_a_config_takes_seq_len_and_says_why_no_activations():
    import torch

    e = estimate_memory(model=torch.nn.Sequential(torch.nn.Linear(4, 4)), seq_len=128)
    assert e.n_params == 20 and e.activation_bytes is None
    assert "no Hugging Face config" in (e.activation_note or "")


def test_lora_on_a_config_without_a_shape_says_why_it_has_none(tmp_path, capsys):
    line = error(["--hf-config", saved(tmp_path, T5), "--lora-rank", "8"], capsys)
    assert line.count("--lora-rank 8:") == 1 and "encoder-decoder" in line
    assert "gives no transformer shape" in line


def test_simulate_of_a_config_without_a_sequence_asks_for_seq_len(tmp_path, capsys):
    line = error(["--hf-config", saved(tmp_path, T5), "--simulate"], capsys)
    assert "--seq-len" in line and "batch=None" not in line and "vocabulary" not in line


def test_a_configs_own_values_are_named_by_its_keys(tmp_path, capsys):
    path = saved(tmp_path, {**LLAMA, "hidden_size": 66})
    line = error(["--hf-config", path], capsys)
    assert f"--hf-config {path}: num_attention_heads 4: must divide hidden_size=66" in line
    assert "--heads" not in line and "--hidden" not in line
    line = error(["--hf-config", path, "--heads", "5"], capsys)
    assert "--heads 5: must divide the config's hidden_size=66 evenly" in line
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(hf_config={**LLAMA, "hidden_size": 66})
    assert [p.field for p in info.value.problems] == ["hf_config"]


def test_compare_stages_with_fsdp_is_refused_by_name(capsys):
    argv = ["--params", "7.5e9", "--gpus", "64", "--compare-stages", "--fsdp", "full_shard"]
    line = error(argv, capsys)
    assert "--fsdp full_shard: leave it out with --compare-stages" in line
    assert "--zero" not in line


def test_a_rotary_config_without_max_positions_is_read_with_seq_len(tmp_path, capsys):
    config = {k: v for k, v in LLAMA.items() if k != "max_position_embeddings"}
    e = estimate_memory(hf_config=config, seq_len=128)
    assert e.seq_len == 128 and e.n_params == estimate_memory(hf_config=LLAMA).n_params
    line = error(["--hf-config", saved(tmp_path, config)], capsys)
    assert "lacks max_position_embeddings (with --seq-len" in line
