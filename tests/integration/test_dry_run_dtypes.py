"""The dry run runs the precision it names: a config.json's `torch_dtype` does not decide
the dtype of the weights, gradients or optimizer states; the report names each one."""

from __future__ import annotations

import pytest

from workbench.config import TrainConfig
from workbench.estimate.hf_build import meta_module
from workbench.train.dry_run import simulate_memory

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}

#: Each precision the dry run takes, and the dtypes it trains (weights, gradients, states).
PRECISIONS = {
    "fp32": ({}, ("fp32", "fp32", "fp32")),
    "amp-bf16": ({}, ("fp32", "fp32", "fp32")),
    "amp-fp16": ({}, ("fp32", "fp32", "fp32")),
    "bf16-true": ({}, ("bf16", "bf16", "bf16")),
    "bf16": ({"zero_stage": 1}, ("bf16", "bf16", "fp32")),
    "fp16": ({"zero_stage": 1}, ("fp16", "fp16", "fp32")),
}


def _run(precision: str, torch_dtype: str):
    module, problems = meta_module({**LLAMA, "torch_dtype": torch_dtype})
    assert module is not None, problems
    extra, _ = PRECISIONS[precision]
    config = TrainConfig(precision=precision, micro_batch=2, **extra)
    return simulate_memory(module, config, seq_len=16, progress=False)


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_a_bf16_config_and_an_fp32_config_give_the_same_dry_run(precision: str) -> None:
    bf16, fp32 = _run(precision, "bfloat16"), _run(precision, "float32")
    weights, grads, states = PRECISIONS[precision][1]
    for run in (bf16, fp32):
        assert run.dtypes["parameters"] == weights
        assert run.dtypes["gradients"] == grads
        assert run.dtypes["optimizer states"] == states
        assert any(n.startswith(f"dtypes ({precision}): parameters {weights}") for n in run.notes)
    assert (bf16.params_bytes, bf16.grads_bytes, bf16.optimizer_bytes) == (
        fp32.params_bytes,
        fp32.grads_bytes,
        fp32.optimizer_bytes,
    )
    assert bf16.by_category == fp32.by_category
    assert bf16.peak_bytes == fp32.peak_bytes
    assert bf16.points == fp32.points


def test_the_cast_is_said() -> None:
    run = _run("amp-bf16", "bfloat16")
    assert any("came with bf16 weights" in n and "fp32" in n for n in run.notes)
    assert not any("came with" in n for n in _run("amp-bf16", "float32").notes)


def test_a_module_with_real_weights_trains_in_its_own_dtype_and_it_is_said() -> None:
    """A Session trains your module as it is; its dry run does the same, and says so."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)).to(torch.bfloat16)
    batch = (torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int64))
    run = simulate_memory(
        model,
        TrainConfig(precision="amp-bf16", micro_batch=4),
        batch=batch,
        loss_fn=nn.functional.cross_entropy,
        progress=False,
    )
    assert run.dtypes["parameters"] == "bf16"
    assert any("a Session trains them as they are" in n for n in run.notes)
    assert next(model.parameters()).dtype is torch.bfloat16  # never changed
