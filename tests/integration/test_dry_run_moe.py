"""The dry run of a mixture of experts whose experts call `torch._grouped_mm` (transformers'
Mixtral) in fp32 or fp16: torch's fake kernel takes bf16 alone, a GPU's runs them all, so
the dry run makes the output the kernel makes."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode

from workbench.config import TrainConfig
from workbench.train.dry_run import simulate_memory
from workbench.train.dry_run.fake import GroupedMatmuls

G, S, K, N = 4, 40, 64, 32
#: (a, b) shapes of each layout torch's kernel takes with offsets over G groups
LAYOUTS = [
    ((S, K), (G, K, N)),  # the experts' forward: tokens x each expert's weight
    ((K, S), (S, N)),  # the weights' gradient: one (K, N) a group
    ((G, S, K), (K, N)),
    ((G, S, K), (G, K, N)),  # a batched matmul, no offsets needed
]


@pytest.mark.parametrize(("a_shape", "b_shape"), LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_grouped_matmul_in_any_dtype_has_the_bf16_kernels_shape(a_shape, b_shape, dtype):
    with FakeTensorMode():
        offs = None if len(a_shape) == len(b_shape) == 3 else torch.empty(G, dtype=torch.int32)
        like = torch._grouped_mm(
            torch.empty(a_shape, dtype=torch.bfloat16),
            torch.empty(b_shape, dtype=torch.bfloat16),
            offs=offs,
        )
        a, b = torch.empty(a_shape, dtype=dtype), torch.empty(b_shape, dtype=dtype)
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            torch._grouped_mm(a, b, offs=offs)  # torch's fake kernel alone
        with GroupedMatmuls():
            out = torch._grouped_mm(a, b, offs=offs)
    assert out.shape == like.shape and out.dtype == dtype


def _meta_mixtral() -> torch.nn.Module:
    config = transformers.MixtralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    with torch.device("meta"):
        return transformers.MixtralForCausalLM(config)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "amp-fp16"])
def test_a_mixtral_dry_run_runs_in_fp32_and_under_autocast(precision) -> None:
    run = simulate_memory(
        _meta_mixtral(), TrainConfig(precision=precision), seq_len=32, progress=False
    )
    assert run.formula is not None
    assert run.params_bytes == run.formula.params_bytes > 0
    assert run.peak_bytes > run.params_bytes
