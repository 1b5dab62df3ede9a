"""Context parallelism in the estimator (`workbench.estimate.context_parallel`), held to
the formula computed by hand.

torch 2.13's `context_parallel` does not run on this CPU (its ring attention dispatches the
fused CUDA sdpa kernels only: on CPU, sdpa is `_scaled_dot_product_flash_attention_for_cpu`,
for which DTensor has no sharding strategy, "NotImplementedError ... does not have a
sharding strategy registered"), so the terms are checked against the formula and against
the same model at the rank's share of the sequence."""

from __future__ import annotations

import pytest

from workbench.estimate import estimate_memory
from workbench.estimate.context_parallel import CP_TERM, exchange_bytes, rank_view
from workbench.estimate.presets import find_model

LLAMA = {"model": "llama-3-8b", "precision": "amp-bf16", "fsdp": "full_shard"}


def test_activations_are_the_rank_share_of_the_sequence() -> None:
    whole = estimate_memory(**LLAMA, seq_len=32768, gpus=8, context_parallel=4)
    share = estimate_memory(**LLAMA, seq_len=8192, gpus=8)
    assert whole.activation_bytes == share.activation_bytes
    assert whole.seq_len == 32768 and whole.context_parallel == 4
    # the same states: FSDP shards over dp x cp = 8 either way
    assert whole.params_bytes == share.params_bytes
    assert whole.optimizer_bytes == share.optimizer_bytes


def test_states_shard_over_data_and_context_parallel_ranks() -> None:
    alone = estimate_memory(**LLAMA, seq_len=8192, gpus=2)
    split = estimate_memory(**LLAMA, seq_len=8192, gpus=8, context_parallel=4)
    assert split.data_parallel == 8  # the group FSDP shards over: dp 2 x cp 4
    assert split.params_bytes * 4 == pytest.approx(alone.params_bytes, rel=1e-3)
    assert "cp 4 x dp 2" in str(split)
    # plain DDP replicates over the cp ranks as over the dp ranks
    ddp = estimate_memory(model="llama-3-8b", seq_len=8192, gpus=4, context_parallel=4)
    one = estimate_memory(model="llama-3-8b", seq_len=8192, gpus=1)
    assert ddp.params_bytes == one.params_bytes and ddp.optimizer_bytes == one.optimizer_bytes


def test_the_ring_buffers_by_hand() -> None:
    # Llama 3 8B: 8 K/V heads of 128, 32 query heads of 128; s = 131072 over cp = 8, b = 1
    arch = rank_view(find_model("llama-3-8b").architecture.replace(seq_len=131072), 8)
    assert arch.seq_len == 16384
    gathered = 2 * 2 * 1 * 131072 * 1024  # K and V of the whole sequence, bf16
    query_grad = 4 * 16384 * 4096  # fp32 accumulator of the local queries' gradient
    ring = 2 * 4 * 16384 * 2 * 1024  # fp32 K/V gradient received and sent
    assert exchange_bytes(arch, 1, 8, 1, 2) == gathered + query_grad + ring == 1073741824
    # tensor parallelism splits the heads
    assert exchange_bytes(arch, 1, 8, 2, 2) == 1073741824 // 2
    assert exchange_bytes(arch, 1, 1, 1, 2) == 0
    # two sequences a micro-batch, fp32 activations: the gathered K/V in 4 bytes
    gathered32 = 2 * 4 * 2 * 131072 * 1024
    assert exchange_bytes(arch, 2, 8, 1, 4) == gathered32 + 2 * query_grad + 2 * ring


def test_zero_1_and_2_shard_their_states_over_data_and_context_parallel_ranks() -> None:
    # ZeRO-1 splits the optimizer states, ZeRO-2 the gradients too, over dp x cp = 8
    for stage in (1, 2):
        split = estimate_memory(model="llama-3-8b", precision="bf16", zero_stage=stage,
                                seq_len=8192, gpus=8, context_parallel=4)  # fmt: skip
        eight = estimate_memory(model="llama-3-8b", precision="bf16", zero_stage=stage,
                                seq_len=8192, gpus=8)  # fmt: skip
        two = estimate_memory(model="llama-3-8b", precision="bf16", zero_stage=stage,
                              seq_len=8192, gpus=2)  # fmt: skip
        assert split.optimizer_bytes == eight.optimizer_bytes < two.optimizer_bytes
        assert split.grads_bytes == eight.grads_bytes
        assert split.params_bytes == two.params_bytes  # weights stay whole under ZeRO-1/2


def test_the_peak_names_the_exchange_beyond_the_layer_transient() -> None:
    e = estimate_memory(
        **LLAMA, seq_len=131072, gpus=8, context_parallel=8, checkpointing="full", loss_chunks=16
    )
    moment = e.peak.moments["last layer's backward"]
    # the MLP's backward (3 x 2 x s_l x f = 1.41e9) is larger than the attention's
    # (4 sbh + 4 sbh = 5.4e8); the attention's plus the ring's buffers (1.07e9) pass it by
    s, h, f = 16384, 4096, 14336
    mlp, attention = 3 * 2 * s * f, 4 * s * h + 2 * 2 * s * h
    expected = max(mlp, attention + 1073741824) - max(mlp, attention)
    assert moment[CP_TERM] == expected == 201326592
    alone = estimate_memory(**LLAMA, seq_len=16384, gpus=8, checkpointing="full", loss_chunks=16)
    assert CP_TERM not in alone.peak.moments["last layer's backward"]


def test_the_flop_count_keeps_the_whole_sequence() -> None:
    whole = estimate_memory(**LLAMA, seq_len=32768, gpus=8, context_parallel=4, tokens="1B")
    plain = estimate_memory(**LLAMA, seq_len=32768, gpus=8, tokens="1B")
    assert whole.model_flops == plain.model_flops


@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"context_parallel": 3}, "context_parallel=3", "multiple of 6"),
        ({"context_parallel": 0}, "context_parallel=0", "integer from 1"),
        ({"context_parallel": 2.0}, "context_parallel=2.0", "integer from 1"),
        ({"context_parallel": 4, "gpus": 6}, "gpus=6", "context_parallel = 4"),
        ({"context_parallel": 2, "attention": "eager"}, "attention='eager'", "must be sdpa"),
        ({"context_parallel": 2, "document_mask": True}, "document_mask=True", "attn_bias"),
        ({"context_parallel": 2, "seq_len": 8190}, "context_parallel=2", "multiple of 4"),
    ],
)
def test_what_torch_cannot_run_is_refused(changes: dict, field: str, says: str) -> None:
    kw = {"model": "llama-3-8b", "gpus": 8, "seq_len": 8192, **changes}
    with pytest.raises(ValueError, match=r"(?s)" + field.replace("(", r"\(") + ".*" + says):
        estimate_memory(**kw)


def test_a_count_without_a_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="context_parallel=2: needs a transformer shape"):
        estimate_memory(n_params="7B", gpus=2, context_parallel=2)


def test_pipeline_and_tensor_parallelism_combine() -> None:
    e = estimate_memory(
        **LLAMA, seq_len=65536, gpus=64, tensor_parallel=8, pipeline_parallel=2,
        context_parallel=4, checkpointing="full",
    )  # fmt: skip
    assert e.data_parallel == 4 and "tp 8 x pp 2 x cp 4 x dp 1" in str(e)
