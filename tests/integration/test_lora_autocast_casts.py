"""LoRA under amp-bf16: autocast casts the frozen weights anew for each matmul and autograd
saves each copy for its input's gradient (an adapter before it trains), so the step holds
2 bytes of every frozen linear weight until backward, one block's at a time under full
recomputation; the estimator's "autocast weight casts" hold the dry run's figure."""

from __future__ import annotations

import pytest

from workbench import TrainConfig
from workbench.train.dry_run import simulate_memory


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, vocab_size=2000,
                         max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_frozen_weights_casts_are_counted_as_the_dry_run_measures(recompute: str) -> None:
    config = TrainConfig(micro_batch=1, precision="amp-bf16", lora_rank=8,
                         activation_checkpointing=recompute)  # fmt: skip
    run = simulate_memory(_llama, config, seq_len=32, progress=False)
    formula = run.formula
    assert formula is not None
    assert formula.peak.terms["autocast weight casts"] > 2 * 8 * 256 * 2  # more than adapters
    assert abs(run.peak_bytes - formula.peak_bytes) <= 0.02 * run.peak_bytes, (
        run.peak_bytes,
        formula.peak_bytes,
    )
