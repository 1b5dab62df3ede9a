"""The blocks a dry run finds in a transformers model it was not told about: the repeated
layers its `_no_split_modules` names (BertLayer), not a one-off also listed there
(BertEmbeddings, whose word embedding is tied to the masked-LM head): made a unit of its
own, it split the tied weight from the head, and FSDP refused every --fsdp-units value."""

from __future__ import annotations

import pytest
import torch
import transformers

from workbench.config import TrainConfig
from workbench.train.dry_run import simulate_memory


def _meta_bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.BertForMaskedLM(config)


def test_berts_blocks_are_its_layers() -> None:
    run = simulate_memory(_meta_bert(), TrainConfig(), seq_len=16, progress=False)
    (note,) = [n for n in run.notes if n.startswith("blocks (FSDP units")]
    assert "2 x BertLayer, from its _no_split_modules" in note and "Embeddings" not in note


@pytest.mark.parametrize("units", ["blocks", "blocks-only"])
def test_bert_shards_under_fsdp_with_its_tied_head(units: str) -> None:
    config = TrainConfig(precision="amp-bf16", fsdp="full_shard", fsdp_units=units)
    run = simulate_memory(_meta_bert(), config, world_size=2, seq_len=16, progress=False)
    assert (run.fsdp, run.world_size) == ("full_shard", 2)
    assert run.formula is not None and run.peak_bytes > 0
