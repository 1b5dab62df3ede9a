"""DeepSpeed ZeRO-1 partitions no gradient in backward: without overlap_comm (its default
at stage 1) every parameter's 16-bit gradient is whole at the end of backward, with the
optimizer offloaded or not. The dry run of DeepSpeed's own engine measures them; the
estimator counts them at the end of backward ("DeepSpeed stage-1 whole gradients")."""

from __future__ import annotations

import os
import sys

from workbench import TrainConfig, estimate_memory
from workbench.train.dry_run import simulate_memory

sys.path.insert(0, os.path.dirname(__file__))
from test_dry_run import FAMILIES  # noqa: E402


def test_stage_1_holds_whole_gradients_at_the_end_of_backward() -> None:
    """Checkpointed, a short sequence: the end of backward is the step's backward peak.
    Stage 1's measured gradients there are near the whole model's (2 bytes a parameter),
    far above its partition (half of them, on 2 ranks), and the formula counts them."""
    config = TrainConfig(micro_batch=1, precision="bf16", zero_stage=1,
                         activation_checkpointing="full")  # fmt: skip
    run = simulate_memory(lambda: FAMILIES["gpt2"]("sdpa"), config, seq_len=16, world_size=2,
                          progress=False)  # fmt: skip
    whole = run.params_bytes  # bf16 weights: the whole gradient is as large
    assert run.points["backward"]["gradients"] >= 0.8 * whole, run.points["backward"]
    formula = run.formula.peak.points["backward"]
    assert formula["DeepSpeed stage-1 whole gradients"] + formula["gradients"] == whole


def test_an_offloaded_optimizer_leaves_stage_1s_gradients_on_the_gpu() -> None:
    kw = dict(model="llama-3-8b", precision="bf16", gpus=8, checkpointing="full",
              seq_len=2048, offload_optimizer=True)  # fmt: skip
    one, two = estimate_memory(zero_stage=1, **kw), estimate_memory(zero_stage=2, **kw)
    whole = 2 * one.n_params
    assert one.peak.points["backward"]["DeepSpeed stage-1 whole gradients"] == whole
    assert one.peak_bytes >= one.params_bytes + whole > two.peak_bytes
