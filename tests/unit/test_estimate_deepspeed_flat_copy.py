"""DeepSpeed's flattened reduce copy in the peak of a step ("DeepSpeed flattened reduce
copy", `workbench.estimate.engine_terms.DeepSpeedBuffers`).

DeepSpeed 0.19 cats a reduce's gradients into one new tensor before the collective and
copies the result back (`allreduce_bucket`: ZeRO 1/2's optimizer, stage 0's engine); the
copy is freed when the reduce returns. Each figure here is computed by hand;
tests/integration/test_dry_run_deepspeed.py measures the copy in DeepSpeed's own engine.
"""

from __future__ import annotations

import pytest

from workbench.estimate import MemoryEstimate, estimate_memory

FLAT = "DeepSpeed flattened reduce copy"
GPT2 = 124_439_808  # the gpt2 preset's parameters
#: The dry run of DeepSpeed's engine (fake tensors, 2 ranks, `workbench estimate --model
#: gpt2 --seq-len 128 --micro-batch 1 --simulate --zero 2 --gpus 2 --json`, fp32 and
#: amp-bf16 alike): its peak of a step, the final reduce (docs/dry_run.md).
GPT2_ZERO2_DRY_RUN_BYTES = 2_239_917_588


def _gpt2_zero2(precision: str, accounting: str = "deepspeed") -> MemoryEstimate:
    return estimate_memory(
        model="gpt2",
        seq_len=128,
        micro_batch=1,
        zero_stage=2,
        gpus=2,
        precision=precision,
        accounting=accounting,
    )


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_zero2s_one_reduce_flattens_every_gradient_before_the_partition_exists(
    precision: str,
) -> None:
    """The workbench's bucket holds every trained parameter: the only reduce is the end of
    backward's, whose copy is 4 bytes x the model (fp32 gradients, under amp-bf16 too)
    beside the bucket, before its reduce makes the gradient partition."""
    e = _gpt2_zero2(precision)
    end = e.peak.moments["backward end"]
    assert end[FLAT] == end["DeepSpeed reduce buckets"] == 4 * GPT2
    assert end["gradients"] == 0 < e.grads_bytes
    for moment in ("loss backward", "last layer's backward"):
        assert FLAT not in e.peak.moments[moment]
    assert (e.peak.phase, e.peak.backward_moment) == ("backward", "backward end")
    # the dry run's peak, and the backward transient the formula keeps there (0.18%)
    assert 0 <= e.peak_bytes - GPT2_ZERO2_DRY_RUN_BYTES <= end["backward transient"]


def test_the_paper_accounting_counts_the_copy_as_it_counts_the_buckets() -> None:
    """DeepSpeed's buffers are the engine's, whichever accounting counts the model states."""
    paper = _gpt2_zero2("fp32", accounting="paper")
    end = paper.peak.moments["backward end"]
    assert end[FLAT] == end["DeepSpeed reduce buckets"] == 4 * GPT2


def test_a_bucket_smaller_than_the_model_is_reduced_beside_the_layers_backward() -> None:
    """7B in bf16 over 8 GPUs with a 1e8-element bucket: the bucket fills and is reduced
    during backward (a copy of 2 x 1e8 bytes beside the activations), and the last reduce
    runs with the gradient partition already made by the first."""
    ds = {"zero_optimization": {"reduce_bucket_size": 1e8}}
    e = estimate_memory(n_params="7B", precision="bf16", zero_stage=2, gpus=8, deepspeed_config=ds)
    moments = e.peak.moments
    assert moments["last layer's backward"][FLAT] == 2 * 100_000_000
    assert moments["backward end"][FLAT] == 2 * 100_000_000
    assert moments["backward end"]["gradients"] == e.grads_bytes == 2 * 7 * 10**9 // 8
    assert FLAT not in moments["loss backward"]  # no reduce before a weight's gradient
    with_overlap = {"zero_optimization": {"reduce_bucket_size": 1e8, "overlap_comm": True}}
    two = estimate_memory(
        n_params="7B", precision="bf16", zero_stage=2, gpus=8, deepspeed_config=with_overlap
    )
    # two buckets, still one copy at a time
    assert two.peak.moments["backward end"]["DeepSpeed reduce buckets"] == 2 * 2 * 100_000_000
    assert two.peak.moments["backward end"][FLAT] == 2 * 100_000_000


def test_stage_1_reduces_in_backward_only_with_overlap_comm() -> None:
    """Without overlap_comm (stage 1's default) its hooks reduce nothing: the copy is made
    after backward from the whole gradients it replaces (their own term); with it, as
    stage 2 does."""
    kw = dict(n_params="1B", precision="bf16", zero_stage=1, gpus=4, accounting="deepspeed")
    plain = estimate_memory(**kw)
    assert all(FLAT not in terms for terms in plain.peak.moments.values())
    assert plain.peak.moments["backward end"]["DeepSpeed stage-1 whole gradients"] > 0
    ds = {"zero_optimization": {"overlap_comm": True}}
    overlap = estimate_memory(**kw, deepspeed_config=ds)
    assert overlap.peak.moments["backward end"][FLAT] == 2 * 500_000_000
    assert FLAT in overlap.peak.moments["last layer's backward"]  # 5e8 < 1e9 parameters


def test_stage_0_flattens_after_backward_in_its_own_chunks() -> None:
    """DeepSpeed's ZeRO-0 engine all-reduces after autograd's backward, flattening at most
    5e8 elements at a time whatever reduce_bucket_size says: the copy is at the end of
    backward only, beside every gradient."""
    ds = {"zero_optimization": {"reduce_bucket_size": 1e6}}
    e = estimate_memory(n_params="1B", precision="bf16", gpus=2, deepspeed_config=ds)
    assert e.peak.engine == "deepspeed"
    end = e.peak.moments["backward end"]
    assert end[FLAT] == 2 * 500_000_000 and end["gradients"] == 2 * 10**9
    assert "DeepSpeed reduce buckets" not in end  # stage 0 holds no bucket of its own
    for moment in ("loss backward", "last layer's backward"):
        assert FLAT not in e.peak.moments[moment]
    small = estimate_memory(n_params="100M", precision="bf16", gpus=2)
    assert small.peak.moments["backward end"][FLAT] == 2 * 100_000_000
