"""Hugging Face-style training: mapping batches are passed as model(**batch), the output's
.loss is the loss without a loss_fn, loss_fn gets fp32 outputs, and a batch that fits no
contract fails when the Session is built. The model is a transformers GPT-2 built from a
config (nothing downloaded)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers  # the test extra
from torch.utils.data import Dataset, TensorDataset

from workbench import Session, TrainConfig

VOCAB, SEQ = 64, 16


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, loss_type="ForCausalLM"
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def test_a_gpt2_trains_on_dict_batches_with_its_own_loss() -> None:
    with Session(TrainConfig(micro_batch=4, lr=1e-3), model=gpt2(), data=Tokens()) as s:
        records = s.run(optimizer_steps=6)
        assert all(torch.isfinite(torch.tensor(r.loss)) for r in records)
        assert records[0].loss == pytest.approx(torch.log(torch.tensor(VOCAB)).item(), rel=0.1)
        report = s.memory()
        assert report.activation_bytes > 0 and report.params_bytes > 0


def test_loss_fn_gets_fp32_logits_and_the_whole_batch_under_amp_bf16() -> None:
    seen: list[tuple[torch.dtype, list[str]]] = []

    def loss_fn(out: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append((out.logits.dtype, sorted(batch)))
        logits = out.logits[:, :-1].reshape(-1, VOCAB)
        return torch.nn.functional.cross_entropy(logits, batch["labels"][:, 1:].reshape(-1))

    config = TrainConfig(micro_batch=4, precision="amp-bf16")
    with Session(config, model=gpt2(), data=Tokens(), loss_fn=loss_fn) as s:
        s.run(optimizer_steps=1)
    assert seen == [(torch.float32, ["input_ids", "labels"])]


def test_a_batch_that_fits_no_contract_fails_when_the_session_is_built() -> None:
    single = TensorDataset(torch.zeros(8, 3))  # batches of one tensor: no targets, no kwargs
    with pytest.raises(ValueError, match=r"data: the first batch is a list of length 1; each "):
        Session(TrainConfig(micro_batch=4), model=gpt2(), data=single)
    pairs = TensorDataset(torch.zeros(8, 3), torch.zeros(8))
    with pytest.raises(ValueError, match=r"loss_fn=None: batches are \(inputs, targets\) pairs"):
        Session(TrainConfig(micro_batch=4), model=torch.nn.Linear(3, 1), data=pairs)


def test_a_model_without_a_loss_says_what_to_do() -> None:
    class NoLabels(Tokens):
        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i]}

    with Session(TrainConfig(micro_batch=4), model=gpt2(), data=NoLabels()) as s:
        with pytest.raises(Exception, match=r"has no loss tensor .*include 'labels'"):
            s.run(optimizer_steps=1)
        assert s.state == "error"
        assert "build a new Session" in s.failure  # not update(): the data cannot change


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_a_transformers_model_gets_its_activation_prediction_from_its_config(kernel) -> None:
    """A Llama trained in a Session: the prediction reads its shape from `model.config`,
    the sequence length from the batches, its attention implementation and dropout."""
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        attention_dropout=0.0,
        attn_implementation=kernel,
    )
    torch.manual_seed(0)
    with Session(
        TrainConfig(micro_batch=4), model=transformers.LlamaForCausalLM(config), data=Tokens()
    ) as s:
        s.run(optimizer_steps=1)
        report = s.memory()
    pred = report.predicted
    assert (pred.attention, pred.dropout, pred.seq_len, pred.layers) == (kernel, False, SEQ, 2)
    assert report.params_bytes == pred.params_bytes
    # the formula leaves out the RMSNorm's normalised copies and statistics, the rotary
    # tables and the token ids (tests/integration/test_estimate_families.py counts them)
    ratio = report.activation_bytes / report.predicted_activation_bytes
    assert 1.0 <= ratio <= 1.25, ratio
