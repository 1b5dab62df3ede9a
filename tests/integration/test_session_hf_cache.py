"""A transformers model trains without a KV cache: the Session (and the exported jobs)
call it with `use_cache=False`, so T5's decoder blocks recompute under activation
checkpointing as they ran (a block that fills a cache saves a different set of tensors
the second time: torch's CheckpointError)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration

from workbench import Session, TrainConfig
from workbench.export import job_common
from workbench.train.techniques.recompute import mark_checkpointable


class Pairs(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [
            {
                "input_ids": torch.randint(1, 64, (8,), generator=g),
                "labels": torch.randint(1, 64, (6,), generator=g),
            }
            for _ in range(16)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def _t5() -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
        decoder_start_token_id=0, pad_token_id=0, dropout_rate=0.0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config)
    assert model.config.use_cache  # as transformers builds it: the case that failed
    mark_checkpointable(model.encoder.block)
    mark_checkpointable(model.decoder.block)
    return model


def test_t5_trains_with_its_blocks_checkpointed_and_the_same_losses() -> None:
    losses = {}
    for ckpt in ("none", "full"):
        cfg = TrainConfig(micro_batch=4, activation_checkpointing=ckpt, seed=3)
        with Session(cfg, model=_t5(), data=Pairs()) as s:
            losses[ckpt] = [r.loss for r in s.run(2)]
            assert s.failure is None
    assert losses["full"] == losses["none"]


def test_the_jobs_loss_gives_a_model_that_takes_use_cache_no_cache() -> None:
    seen: list[dict] = []

    class Takes(nn.Module):
        def forward(self, x: torch.Tensor, use_cache: bool | None = None) -> dict:
            seen.append({"use_cache": use_cache})
            return {"loss": x.sum()}

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> dict:
            return {"loss": x.sum()}

    batch = {"x": torch.ones(2)}
    job_common.loss_of(Takes(), batch, None)
    job_common.loss_of(Takes(), {**batch, "use_cache": True}, None)  # the batch's own wins
    job_common.loss_of(Plain(), batch, None)  # a forward without it is called as before
    assert seen == [{"use_cache": False}, {"use_cache": True}]
