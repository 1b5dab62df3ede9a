"""LoRA targets that pick none of a model's linear layers: the dry run and the Session say
why once, from the same data, and name GPT-2's Conv1D projections as what LoRA here does
not wrap (an 'all-linear' that picks only the head told the user to give 'all-linear')."""

from __future__ import annotations

import pytest
import torch
import transformers

from workbench.config import TrainConfig
from workbench.train.dry_run import DryRunError, simulate_memory
from workbench.train.techniques.lora import lora_problem


def _meta_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=256, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(config)


def test_gpt2s_conv1d_projections_are_named_once_by_the_dry_run() -> None:
    with pytest.raises(DryRunError) as got:
        simulate_memory(_meta_gpt2(), TrainConfig(lora_rank=8), seq_len=16, progress=False)
    text = str(got.value)
    assert text.count("lora_targets=") == 1, text
    assert "transformers' Conv1D layers (transformer.h.0.attn.c_attn" in text
    assert "give their names or name endings, or 'all-linear'" not in text
    (problem,) = got.value.problems
    assert (problem.field, problem.value) == ("lora_targets", "all-linear")


def test_the_session_says_the_same_reason() -> None:
    problem = lora_problem(_meta_gpt2(), TrainConfig(lora_rank=8))
    assert problem is not None and problem.field == "lora_targets"
    assert problem.message.startswith("picks none of the model's linear layers (lm_head): its")
