"""When ZeRO 1/2's contiguous reduce buckets are alive ("DeepSpeed reduce buckets").

DeepSpeed 0.19 (`stage_1_and_2.py`) allocates them in `setup_buckets`, which the gradient
hook of the first parameter whose gradient is ready calls (`process_gradients`): after the
loss's backward, beside the output projection's gradient. It releases them after backward
(`independent_gradient_partition_epilogue` -> `_release_ipg_buffers`), which stage 2 runs
after every backward and stage 1 only at the accumulation boundary (`reduce_gradients`).
The dry run of DeepSpeed's engine shows both (tests/integration/test_dry_run_deepspeed.py).
"""

from __future__ import annotations

import pytest

from workbench.estimate import estimate_memory

BUCKETS = "DeepSpeed reduce buckets"
SHAPE = dict(layers=2, hidden=128, heads=4, seq_len=128, vocab=512, micro_batch=2)


@pytest.mark.parametrize(
    ("stage", "overlap"), [(1, False), (1, True), (2, False), (2, True)]
)  # fmt: skip
def test_the_buckets_appear_with_the_first_gradient_not_in_the_loss_backward(
    stage: int, overlap: bool
) -> None:
    ds = {"zero_optimization": {"overlap_comm": overlap}}
    e = estimate_memory(**SHAPE, precision="bf16", zero_stage=stage, gpus=4, deepspeed_config=ds)
    bucket = 2 * e.n_params * (2 if overlap else 1)  # the workbench caps it at Ψ (x 64)
    moments = e.peak.moments
    assert BUCKETS not in moments["loss backward"]
    assert BUCKETS not in e.peak.points["forward end"]
    assert moments["last layer's backward"][BUCKETS] >= bucket
    assert moments["backward end"][BUCKETS] == moments["last layer's backward"][BUCKETS]


def test_stage_1_keeps_its_buckets_across_accumulated_micro_batches() -> None:
    """Stage 1 releases its buckets at the accumulation boundary only: the last
    micro-batch's forward and loss hold those the first one's backward allocated; stage 2
    releases them after each backward."""
    one = estimate_memory(**SHAPE, precision="bf16", zero_stage=1, gpus=4, grad_accum=2)
    two = estimate_memory(**SHAPE, precision="bf16", zero_stage=2, gpus=4, grad_accum=2)
    held = one.peak.moments["last layer's backward"][BUCKETS]
    assert one.peak.points["forward end"][BUCKETS] == held
    assert one.peak.moments["loss backward"][BUCKETS] == held
    assert BUCKETS not in two.peak.points["forward end"]
    assert BUCKETS not in two.peak.moments["loss backward"]
