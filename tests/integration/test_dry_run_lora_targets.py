"""LoRA targets that pick none of a model's linear layers: the dry run and the Session say
why once, from the same data, naming the linear layers there are: on GPT-2 its
transformers Conv1D projections, which LoRA wraps (an 'all-linear' that picked only the
head once told the user to give 'all-linear'; GPT-2 was refused before LoRA wrapped
Conv1D: tests/integration/test_lora_gpt2.py)."""

from __future__ import annotations

import pytest
import torch
import transformers

from workbench.config import TrainConfig
from workbench.train.dry_run import DryRunError, simulate_memory
from workbench.train.techniques.lora import lora_problem

#: Llama's attention projections, which GPT-2 does not have
LLAMA_NAMES = "q_proj,v_proj"


def _meta_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=256, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(config)


def test_targets_gpt2_lacks_are_named_once_by_the_dry_run_with_its_conv1d_layers() -> None:
    config = TrainConfig(lora_rank=8, lora_targets=LLAMA_NAMES)
    with pytest.raises(DryRunError) as got:
        simulate_memory(_meta_gpt2(), config, seq_len=16, progress=False)
    text = str(got.value)
    assert text.count("lora_targets=") == 1, text
    assert "picks none of the model's linear layers (transformer.h.0.attn.c_attn, " in text
    (problem,) = got.value.problems
    assert (problem.field, problem.value) == ("lora_targets", LLAMA_NAMES)


def test_the_session_says_the_same_reason() -> None:
    problem = lora_problem(_meta_gpt2(), TrainConfig(lora_rank=8, lora_targets=LLAMA_NAMES))
    assert problem is not None and problem.field == "lora_targets"
    assert problem.message.startswith(
        "picks none of the model's linear layers (transformer.h.0.attn.c_attn, "
        "transformer.h.0.attn.c_proj, transformer.h.0.mlp.c_fc"
    )
    assert problem.message.endswith("give their names or name endings, or 'all-linear'")
    assert lora_problem(_meta_gpt2(), TrainConfig(lora_rank=8)) is None  # all-linear picks them
