"""A tied embedding's gradient sum at its backward (`workbench.estimate.tied_embedding`).

The one vocab x hidden weight gets the output projection's gradient early in backward and
the embedding lookup's at its end; autograd adds them while both are alive (in place into
the first where it is a new tensor: under autocast and ZeRO-3). Each figure is computed by
hand here from the module docstring's rule; tests/integration/test_tied_embedding.py
measures them with the dry run (and with real tensors on this CPU).
"""

from __future__ import annotations

import pytest

from workbench.cli import main
from workbench.estimate import MemoryEstimate, estimate_memory
from workbench.estimate.tied_embedding import EMBEDDING_MOMENT, TIED_SUM_TERM

V, H = 50257, 768  # GPT-2's vocabulary and width (the gpt2 preset)
VH = V * H
#: GPT-2 124M at 1 x 128 tokens: the embedding's backward is the step's highest moment
GPT2 = dict(model="gpt2", seq_len=128, micro_batch=1)


def _tied(e: MemoryEstimate) -> int:
    return e.peak.moments[EMBEDDING_MOMENT][TIED_SUM_TERM]


@pytest.mark.parametrize(
    ("settings", "tensors"),
    [
        # the plain loop: the projection's gradient is a view (three tensors), one of them
        # the weight's .grad, which the gradients count
        (dict(precision="fp32"), 2 * 4),
        (dict(precision="bf16-true"), 2 * 2),
        # autocast: the fp32 copy of its 16-bit gradient, summed in place (two tensors)
        (dict(precision="amp-bf16"), 1 * 4),
        (dict(precision="amp-fp16"), 1 * 4),
        # accumulation: the .grad the gradients count is the earlier micro-batches' sum
        (dict(precision="fp32", grad_accum=4), 3 * 4),
        (dict(precision="amp-bf16", grad_accum=2), 2 * 4),
        # DeepSpeed: ZeRO-0 and ZeRO-1 without overlap_comm keep whole .grads as the loop
        (dict(precision="fp32", gpus=2), 2 * 4),
        (dict(precision="bf16", zero_stage=1, gpus=2), 2 * 2),
        (dict(precision="bf16", zero_stage=1, gpus=2, grad_accum=2), 3 * 2),
        # ZeRO-1 with overlap_comm and ZeRO-2 move gradients into the bucket: none counted
        (
            dict(
                precision="bf16",
                zero_stage=1,
                gpus=2,
                deepspeed_config={"zero_optimization": {"overlap_comm": True}},
            ),
            3 * 2,
        ),
        (dict(precision="bf16", zero_stage=2, gpus=2), 3 * 2),
        (dict(precision="amp-bf16", zero_stage=2, gpus=2), 2 * 4),
        (dict(precision="fp16", zero_stage=2, gpus=2, grad_accum=2), 3 * 2),
        # ZeRO-3's linear function makes a new weight gradient: summed in place
        (dict(precision="bf16", zero_stage=3, gpus=2), 2 * 2),
        (dict(precision="amp-bf16", zero_stage=3, gpus=2), 2 * 4),
        # FSDP: no autocast (its policy gathers 16-bit weights), the unsharded gradient in
        # the compute dtype, one of them the root's unsharded gradient
        (dict(precision="fp32", fsdp="full_shard", gpus=2), 2 * 4),
        (dict(precision="amp-bf16", fsdp="full_shard", gpus=2), 2 * 2),
        (dict(precision="amp-bf16", fsdp="shard_grad_op", gpus=2, grad_accum=2), 2 * 2),
        # each gradient stepped and freed as it is made: none counted
        (dict(precision="fp32", optimizer_in_backward=True), 3 * 4),
    ],
)
def test_the_sum_holds_the_tensors_the_gradients_do_not_count(
    settings: dict[str, object], tensors: int
) -> None:
    e = estimate_memory(**GPT2, **settings)
    assert _tied(e) == tensors * VH, settings


def test_a_vocabulary_parallel_embedding_sums_its_rows():
    e = estimate_memory(**GPT2, precision="fp32", tensor_parallel=2, gpus=2)
    assert _tied(e) == 2 * 4 * (-(-V // 2)) * H


def test_only_a_tied_embedding_that_trains_on_this_stage_has_the_instant():
    assert _tied(estimate_memory(**GPT2)) > 0
    for settings in (
        dict(GPT2, model="llama-2-7b"),  # untied: the head has a weight of its own
        dict(GPT2, tied_embeddings=False),
        dict(GPT2, pipeline_parallel=2, gpus=2),  # on different stages
        dict(GPT2, lora_rank=8),  # the embedding is frozen
        dict(n_params="124M"),  # no shape
    ):
        e = estimate_memory(**settings)
        assert EMBEDDING_MOMENT not in e.peak.moments, settings
        assert all(TIED_SUM_TERM not in terms for terms in e.peak.points.values()), settings


def test_the_instant_is_the_peak_of_a_short_sequence():
    """GPT-2 124M, fp32, 1 x 128 tokens, AdamW fused (no step temporaries): the
    embedding's backward holds every gradient and three vocab x hidden tensors, above the
    end of backward's (the weight's gradient counted once, the last layer's activation
    gradients gone) and the optimizer step's."""
    e = estimate_memory(**GPT2, precision="fp32", optimizer_impl="fused")
    peak = e.peak
    assert (peak.phase, peak.backward_moment) == ("backward", EMBEDDING_MOMENT)
    at = peak.moments[EMBEDDING_MOMENT]
    assert at == {
        "parameters": e.params_bytes,
        "optimizer states": e.optimizer_bytes,
        "gradients": e.grads_bytes,
        TIED_SUM_TERM: 2 * 4 * VH,
    }
    assert (
        e.peak_bytes
        == sum(at.values())
        == e.params_bytes + e.optimizer_bytes + 4 * (e.n_params + 2 * VH)
    )
    assert peak.terms[TIED_SUM_TERM] == 2 * 4 * VH  # the peak's named terms carry it
    end = peak.moments["backward end"]
    assert e.peak_bytes - sum(end.values()) == 2 * 4 * VH - end["backward transient"]


def test_the_engines_buffers_at_the_instant():
    """Before the final reduce: ZeRO-2's bucket without its flattened copy, ZeRO-3's
    gathered embedding, FSDP's root unit with its unsharded gradients and the last layer's
    reduce-scatter input, every sharded gradient but the root's (with accumulation the
    root's too); ZeRO-1 with overlap_comm reduces at the accumulation boundary only."""
    two = estimate_memory(**GPT2, precision="bf16", zero_stage=2, gpus=2).peak.moments
    assert (
        two[EMBEDDING_MOMENT]["DeepSpeed reduce buckets"]
        == two["backward end"]["DeepSpeed reduce buckets"]
    )
    assert "DeepSpeed flattened reduce copy" not in two[EMBEDDING_MOMENT]
    assert two[EMBEDDING_MOMENT]["gradients"] == 0  # no reduce yet: no partition
    three = estimate_memory(**GPT2, precision="bf16", zero_stage=3, gpus=2).peak.moments
    embedding = V * H + 1024 * H  # the token and position tables
    gathered = "ZeRO-3 gathered parameters"  # the embedding, in the weights' dtype
    assert three[EMBEDDING_MOMENT][gathered] == 2 * embedding
    amp = estimate_memory(**GPT2, precision="amp-bf16", zero_stage=3, gpus=2).peak.moments
    assert amp[EMBEDDING_MOMENT][gathered] == 4 * embedding  # amp-*'s fp32 weights
    e = estimate_memory(**GPT2, precision="amp-bf16", fsdp="full_shard", gpus=2)
    at = e.peak.moments[EMBEDDING_MOMENT]
    root = embedding + 2 * H  # and the final LayerNorm (the head is the embedding)
    layer = 12 * H * H + 13 * H  # a GPT-2 block's parameters
    assert at["FSDP gathered parameters"] == 2 * root
    assert at["FSDP unsharded gradients"] == 2 * root + 4 * layer  # reduced in fp32
    assert at["gradients"] == e.grads_bytes - e.grads_bytes * root // e.n_params
    accumulated = estimate_memory(**GPT2, precision="amp-bf16", fsdp="full_shard", gpus=2,
                                  grad_accum=2)  # fmt: skip
    assert accumulated.peak.moments[EMBEDDING_MOMENT]["gradients"] == accumulated.grads_bytes
    overlap = {"zero_optimization": {"overlap_comm": True}}
    one = estimate_memory(**GPT2, precision="bf16", zero_stage=1, gpus=2, grad_accum=2,
                          deepspeed_config=overlap)  # fmt: skip
    assert one.peak.moments[EMBEDDING_MOMENT]["gradients"] == 0
    assert one.peak.moments[EMBEDDING_MOMENT][TIED_SUM_TERM] == 4 * 2 * VH  # with its .grad


def test_workbench_estimate_prints_the_term(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "--model", "gpt2", "--seq-len", "128", "--micro-batch", "1"]
    args += ["--optimizer-impl", "fused"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "peak of a step, at the backward" in out
    assert TIED_SUM_TERM in out
