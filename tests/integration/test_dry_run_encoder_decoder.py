"""The dry run of an encoder-decoder (t5, mt5, bart): its decoder is fed decoder_input_ids,
so a config.json without `decoder_start_token_id` (what transformers writes for a
`T5Config()`) runs as one with it; a batch of labels alone, for a model whose config lacks
the key the model shifts them with, is refused naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from workbench.cli import main
from workbench.config import TrainConfig
from workbench.train.dry_run import DryRunError, simulate_memory

T5 = {
    "model_type": "t5",
    "vocab_size": 256,
    "d_model": 64,
    "d_kv": 16,
    "d_ff": 128,
    "num_layers": 2,
    "num_heads": 4,
    "pad_token_id": 0,
    "eos_token_id": 1,
}
BART = {
    "model_type": "bart",
    "vocab_size": 256,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 64,
}


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def _dry_run(config: dict[str, object], tmp_path: Path, capsys) -> dict[str, object]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    args = ["estimate", "--hf-config", str(path), "--seq-len", "16", "--micro-batch", "2"]
    code, out, err = _run([*args, "--simulate", "--json"], capsys)
    assert code == 0, err
    dry: dict[str, object] = json.loads(out)["dry_run"]
    return dry


@pytest.mark.parametrize(
    "config",
    [
        {**T5},  # as T5Config().to_json_file() writes it: no decoder_start_token_id
        {**T5, "model_type": "mt5"},
        {**BART, "pad_token_id": 1},
    ],
    ids=["t5", "mt5", "bart"],
)
def test_an_encoder_decoder_runs_with_or_without_decoder_start_token_id(
    config, tmp_path, capsys
) -> None:
    without = _dry_run(config, tmp_path, capsys)
    with_it = _dry_run({**config, "decoder_start_token_id": 0}, tmp_path, capsys)
    assert "decoder_input_ids" in str(without["batch"])
    assert without["peak_bytes"] == with_it["peak_bytes"] > 0
    assert without["params_bytes"] == with_it["params_bytes"]


def _meta_t5() -> torch.nn.Module:
    config = transformers.T5Config(**{k: v for k, v in T5.items() if k != "model_type"})
    assert getattr(config, "decoder_start_token_id", None) is None
    with torch.device("meta"):
        return transformers.T5ForConditionalGeneration(config)


def test_a_tensor_of_token_ids_feeds_the_decoder_too() -> None:
    run = simulate_memory(
        _meta_t5(), TrainConfig(), batch=torch.zeros((2, 16), dtype=torch.int64), progress=False
    )
    assert run.micro_batch == 2 and run.seq_len == 16 and run.peak_bytes > 0


def test_labels_alone_without_the_key_to_shift_them_are_refused_naming_it() -> None:
    ids = torch.zeros((2, 16), dtype=torch.int64)
    with pytest.raises(DryRunError, match=r"batch=.*has no decoder_start_token_id") as info:
        simulate_memory(
            _meta_t5(), TrainConfig(), batch={"input_ids": ids, "labels": ids}, progress=False
        )
    assert "add decoder_input_ids to the batch" in str(info.value)
    run = simulate_memory(  # the decoder's ids given: nothing to shift
        _meta_t5(),
        TrainConfig(),
        batch={"input_ids": ids, "decoder_input_ids": ids, "labels": ids},
        progress=False,
    )
    assert run.peak_bytes > 0


def test_a_t5_config_json_with_n_positions_runs_at_that_length(tmp_path, capsys) -> None:
    """t5-small's config.json names its length n_positions (512), not max_position_embeddings:
    the dry run's token ids span it, as they span a gpt2 config's n_positions; a config with
    none of the keys still asks for --seq-len, naming the keys it reads."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**T5, "decoder_start_token_id": 0, "n_positions": 24}))
    code, out, err = _run(["estimate", "--hf-config", str(path), "--simulate", "--json"], capsys)
    assert code == 0, err
    dry = json.loads(out)["dry_run"]
    assert dry["seq_len"] == 24 and "(its context length)" in dry["batch"]
    path.write_text(json.dumps(T5))
    code, _, err = _run(["estimate", "--hf-config", str(path), "--simulate"], capsys)
    assert code == 2 and "sets none of max_position_embeddings, n_positions" in err
    assert "give --seq-len" in err


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_an_encoder_decoder_recomputes_its_blocks_without_a_kv_cache(family) -> None:
    """t5's decoder stack holds a copy of the config with use_cache=True: the dry run's copy
    trains without the cache there too, so a checkpointed decoder block recomputes what it
    saved (with the cache the recomputation reads its own keys back: a CheckpointError)."""
    if family == "t5":
        module = _meta_t5()
    else:
        config = transformers.BartConfig(**{k: v for k, v in BART.items() if k != "model_type"})
        with torch.device("meta"):
            module = transformers.BartForConditionalGeneration(config)
    before = [part.config.use_cache for part in module.modules() if hasattr(part, "config")]
    plain = simulate_memory(module, TrainConfig(), seq_len=16, progress=False)
    full = simulate_memory(
        module, TrainConfig(activation_checkpointing="full"), seq_len=16, progress=False
    )
    assert 0 < full.peak_bytes < plain.peak_bytes
    after = [part.config.use_cache for part in module.modules() if hasattr(part, "config")]
    assert after == before and True in before  # the user's module keeps its own settings
