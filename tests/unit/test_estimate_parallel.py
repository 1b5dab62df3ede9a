"""Tensor, sequence and pipeline parallelism: Korthikanti et al. 2022 Table 2, Megatron's
model-state layout, and the errors for combinations that cannot be split."""

from __future__ import annotations

import pytest

from workbench.estimate import (
    MODELS,
    Architecture,
    EstimateInputError,
    estimate_memory,
    transformer_activation_bytes,
)

S, B, H, A, V = 2048, 1, 12288, 96, 50257  # GPT-3 175B, micro-batch 1
SBH = S * B * H
GPT3 = dict(layers=96, hidden=H, heads=A, seq_len=S, vocab=V, attention="megatron")  # the paper's


def per_layer(t: int, sp: bool, mode: str) -> int:
    return transformer_activation_bytes(
        **GPT3, micro_batch=B, checkpointing=mode, tensor_parallel=t, sequence_parallel=sp
    ).per_layer_bytes


def test_korthikanti_table_2_at_gpt3_with_tensor_parallel_8():
    """Table 2, per layer at 16 bits, t = 8; 5as/h = 80 for GPT-3, so 5as/(ht) = 10."""
    assert 5 * A * S / (H * 8) == 10
    # tensor parallel: sbh(10 + 24/t + 5as/(ht)) = 23 sbh
    assert per_layer(8, False, "none") == 23 * SBH == 578_813_952
    # tensor + sequence parallel: sbh(34/t + 5as/(ht)) = 14.25 sbh
    assert per_layer(8, True, "none") == SBH * 57 // 4 == 358_612_992
    # tensor parallel + selective recomputation: sbh(10 + 24/t) = 13 sbh
    assert per_layer(8, False, "selective") == 13 * SBH == 327_155_712
    # tensor + sequence parallel + selective recomputation: 34 sbh / t = 4.25 sbh
    assert per_layer(8, True, "selective") == SBH * 17 // 4 == 106_954_752
    # full recomputation keeps the layer input: 2sbh, sequence-sharded with SP
    assert per_layer(8, False, "full") == 2 * SBH
    assert per_layer(8, True, "full") == 2 * SBH // 8


def test_tensor_parallel_1_is_the_unsplit_formula():
    assert per_layer(1, False, "none") == SBH * (34 + 80)
    assert per_layer(1, False, "selective") == 34 * SBH


def test_swiglu_and_ffn_size_in_the_per_layer_terms():
    """Per layer at 16 bits, no dropout: 2 bytes x (7sbh + MLP + as^2b). GELU MLP keeps
    its input, the GELU input and output (sbh + 2sbf); SwiGLU its input, the gate and up
    outputs, the SiLU output and the product (sbh + 4sbf)."""
    s, b, h, a, f = 16, 2, 32, 4, 88
    sbh, sbf, as2b = s * b * h, s * b * f, a * s * s * b
    kw = dict(layers=2, hidden=h, heads=a, seq_len=s, micro_batch=b, vocab=10, dropout=False)
    gelu = transformer_activation_bytes(**kw, ffn_hidden=f)
    swiglu = transformer_activation_bytes(**kw, ffn_hidden=f, mlp="swiglu")
    assert gelu.per_layer_bytes == 2 * (7 * sbh + sbh + 2 * sbf + as2b)
    assert swiglu.per_layer_bytes == 2 * (7 * sbh + sbh + 4 * sbf + as2b)
    parallel = transformer_activation_bytes(**kw, ffn_hidden=f, parallel_residual=True)
    assert gelu.per_layer_bytes - parallel.per_layer_bytes == 2 * sbh  # one norm input fewer


def test_pipeline_first_stage_holds_pp_micro_batches_of_its_layers():
    kw = dict(**GPT3, micro_batch=1, checkpointing="selective", tensor_parallel=8)
    one = transformer_activation_bytes(**kw, sequence_parallel=True)
    eight = transformer_activation_bytes(**kw, sequence_parallel=True, pipeline_parallel=8)
    # 96 / 8 = 12 layers x 8 micro-batches in flight = all 96 layers' worth
    assert eight.layers_bytes == one.layers_bytes == 96 * 34 * SBH // 8
    assert eight.in_flight_micro_batches == 8
    assert eight.embedding_bytes == 8 * SBH // 8  # the dropout mask of each in-flight batch
    assert eight.output_bytes == 0 and one.output_bytes > 0  # the output layer is on the last stage
    # vocabulary-parallel logits: 4 bytes x s x b x ceil(v / t)
    assert one.logits_bytes == 4 * S * B * -(-V // 8)


# ------------------------------------------------------------------ model states
def test_megatron_layout_of_a_small_gpt_by_hand():
    """layers 4, hidden 8, heads 2, vocab 10, seq 4, GPT style, tp 2, pp 2.

    Per layer: weights 12h^2 = 768 and column-parallel biases (QKV 3h, fc1 4h) = 56 are
    split; row-parallel biases (proj, fc2) 16 and two LayerNorms 32 are replicated:
    (768 + 56) / 2 + 48 = 460 per GPU. A stage has 2 layers = 920. First stage: + token
    embedding ceil(10/2) x 8 = 40 + position table 4 x 8 = 32 -> 992. Last stage: final
    LayerNorm 16 + its own copy of the tied output projection 40 -> 976.
    """
    arch = Architecture.create(layers=4, hidden=8, heads=2, seq_len=4, vocab=10)
    assert arch.layer_params() == 872 and arch.layer_params(2) == 460
    assert arch.stage_params(2, 2) == 992
    assert arch.n_params == 3616 == arch.stage_params(1, 1)
    e = estimate_memory(model=arch, gpus=8, tensor_parallel=2, pipeline_parallel=2)
    assert (e.data_parallel, e.shard_params, e.n_params) == (2, 992, 3616)
    assert (e.params_bytes, e.grads_bytes, e.optimizer_bytes) == (4 * 992, 4 * 992, 8 * 992)
    z3 = estimate_memory(model=arch, gpus=8, tensor_parallel=2, pipeline_parallel=2, zero_stage=3)
    assert z3.params_bytes == 4 * 496  # ZeRO shards the 992 over the 2 data-parallel GPUs


def test_gqa_swiglu_layer_split_by_hand():
    """hidden 8, 4 heads, 2 kv heads (g = 4), SwiGLU 12, RMSNorm, no biases, tp 2:
    (Q 64 + K, V 2 x 32 + O 64 + MLP 3 x 96) / 2 + two RMSNorms 16 = 240 + 16."""
    arch = Architecture.create(
        layers=2,
        hidden=8,
        heads=4,
        kv_heads=2,
        ffn_hidden=12,
        seq_len=4,
        vocab=10,
        mlp="swiglu",
        norm="rmsnorm",
        bias="none",
        positions="rotary",
        tied_embeddings=False,
    )
    assert arch.layer_params(2) == 256


def test_llama_3_8b_on_64_gpus_by_hand():
    """tp 8, pp 2: 16 layers of (218,103,808 weights / 8 + 8,192 norm weights) plus,
    on the last stage, the final norm 4,096 and the output projection 16,032 x 4,096."""
    e = estimate_memory(
        model="llama-3-8b", precision="bf16", gpus=64, tensor_parallel=8, pipeline_parallel=2
    )
    layers = 16 * (218_103_808 // 8 + 8_192)
    assert e.shard_params == layers + 4_096 + 16_032 * 4_096 == 502_009_856
    assert e.data_parallel == 4 and e.params_bytes == 2 * e.shard_params


def test_no_parallelism_leaves_the_estimate_unchanged():
    a = estimate_memory(**GPT3, precision="bf16", zero_stage=3, gpus=1024, checkpointing="full")
    assert (a.tensor_parallel, a.pipeline_parallel, a.data_parallel) == (1, 1, 1024)
    assert a.shard_params == a.n_params == 174_604_259_328
    assert a.activation_bytes == 8_187_944_960  # the hand-computed total of test_estimate


def test_more_tensor_parallelism_never_increases_per_gpu_bytes():
    totals = [
        estimate_memory(
            model="llama-2-70b",
            precision="bf16",
            gpus=8,
            tensor_parallel=t,
            checkpointing="selective",
            sequence_parallel=t > 1,
        ).total_bytes
        for t in (1, 2, 4, 8)
    ]
    assert totals == sorted(totals, reverse=True)


def test_explicit_n_params_is_split_in_the_shapes_proportion():
    arch = MODELS["llama-3-8b"].architecture
    e = estimate_memory(model="llama-3-8b", n_params=16_060_522_496, gpus=8, tensor_parallel=8)
    assert e.shard_params == 2 * arch.stage_params(8, 1)  # twice the count, twice the shard


# ------------------------------------------------------------------ invalid combinations
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            dict(model="llama-3-8b", gpus=3, tensor_parallel=3),
            r"tensor_parallel=3: must divide heads=32 evenly",
        ),
        (
            dict(model="llama-3-8b", gpus=16, tensor_parallel=16),
            r"tensor_parallel=16: must divide kv_heads=8 evenly",
        ),
        (
            dict(model="llama-3-8b", gpus=12, tensor_parallel=8),
            r"gpus=12: must be a multiple of tensor_parallel x pipeline_parallel = 8",
        ),
        (
            dict(model="llama-3-8b", gpus=5, pipeline_parallel=5),
            r"pipeline_parallel=5: must divide layers=32 evenly",
        ),
        (
            dict(model="llama-3-8b", sequence_parallel=True),
            r"sequence_parallel=True: needs tensor_parallel > 1 \(got 1\)",
        ),
        (
            dict(n_params="7B", gpus=8, tensor_parallel=8),
            r"tensor_parallel=8: needs a transformer shape",
        ),
        (
            dict(model="gpt2", tensor_parallel=0),
            r"tensor_parallel=0: must be an integer from 1 to 10\^7",
        ),
        (dict(model="gpt2", pipeline_parallel="2"), r"pipeline_parallel='2': must be an integer"),
        (
            dict(model="gpt2", sequence_parallel="yes"),
            r"sequence_parallel='yes': must be True or False",
        ),
    ],
)
def test_invalid_parallel_combinations(kwargs, match):
    with pytest.raises(EstimateInputError, match=match):
        estimate_memory(**kwargs)


def test_every_parallel_problem_at_once():
    with pytest.raises(EstimateInputError) as info:
        estimate_memory(
            model="llama-3-8b", gpus=20, tensor_parallel=3, pipeline_parallel=3, zero_stage=9
        )
    fields = [p.field for p in info.value.problems]
    assert fields.count("tensor_parallel") == 3  # heads 32, kv heads 8, ffn 14336
    assert "pipeline_parallel" in fields and "gpus" in fields and "zero_stage" in fields
