"""Context parallelism in the planner: searched at long sequences, pinnable, its memory the
estimator's `context_parallel` and its time the ring attention's K/V exchange."""

from __future__ import annotations

import pytest

from workbench.estimate import estimate_memory
from workbench.planner import collectives as nccl
from workbench.planner import plan
from workbench.planner.hardware import cluster
from workbench.planner.space import CP_MIN_SEQ, context_parallel_sizes
from workbench.planner.steptime import Layout, Shape, ring_seconds, step_time

LLAMA = {"model": "llama-3-8b", "gpu": "h100", "gpus": 16}


def test_searched_from_long_sequences_only() -> None:
    assert context_parallel_sizes(None, 16, 131072) == [1, 2, 4, 8, 16]
    assert context_parallel_sizes(None, 16, CP_MIN_SEQ // 2) == [1]
    assert context_parallel_sizes(None, 12, 65536) == [1, 2, 4]  # powers of two dividing
    assert context_parallel_sizes(4, 16, 8192) == [4]  # pinned: planned at any length
    long = plan(**LLAMA, seq_len=65536, global_batch=16, engines=("full_shard",))
    assert {p.cp for p in long.plans} > {1}
    short = plan(**LLAMA, seq_len=8192, global_batch=16, engines=("full_shard",))
    assert {p.cp for p in short.plans} == {1}


def test_a_pinned_cp_is_planned_with_its_memory_from_the_estimator() -> None:
    result = plan(**LLAMA, seq_len=32768, global_batch=8, pin="cp=4,tp=1,pp=1")
    assert result.plans and all(p.cp == 4 and p.dp == 4 for p in result.plans)
    best = result.best
    assert "cp 4" in best.label() and best.to_dict()["cp"] == 4
    est = estimate_memory(**est_inputs(best), context_parallel=4)
    assert best.peak_bytes == est.peak_bytes
    # a sequence's activations split over 4: the same setup without cp needs more
    assert (
        estimate_memory(**{**est_inputs(best), "context_parallel": 1}).peak_bytes > est.peak_bytes
    )


def est_inputs(best: object) -> dict:
    s = best.settings  # type: ignore[attr-defined]
    return {
        "model": "llama-3-8b", "seq_len": 32768, "gpu": "h100-80gb", "gpus": 16,
        "micro_batch": s["micro_batch"], "grad_accum": s["grad_accum"],
        "fsdp": s.get("fsdp", "off"), "zero_stage": s.get("zero_stage", 0),
        "precision": s["precision"], "checkpointing": s["activation_checkpointing"],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pin", "says"),
    [
        ("cp=3", "2 x cp = 6 must divide seq_len=32768"),
        ("cp=4,engine=zero3", "engines planned are zero3"),
        ("cp=4,tp=2,pp=1,dp=4", "must be the 16 GPUs"),
        ("cp=32", "must divide the 16 GPUs"),
    ],
)
def test_a_pinned_cp_that_cannot_run_says_why(pin: str, says: str) -> None:
    with pytest.raises(ValueError, match="pin.*" + says.replace("(", r"\(")):
        plan(**LLAMA, seq_len=32768, global_batch=8, pin=pin)


def _layout(cp: int, checkpointing: str = "none") -> Layout:
    return Layout(
        tp=1, pp=1, dp=2, micro_batch=1, accum=1, engine="full_shard",
        checkpointing=checkpointing, sixteen_bit=True, bf16=True, grad_bytes=4, cp=cp,
    )  # fmt: skip


def test_the_exchange_by_hand() -> None:
    # Llama 3 8B's width at 131072 tokens, cp 8 over one node of H100s, bf16
    hw = cluster("h100", gpus_per_node=8, nodes=2)
    shape = Shape(n_params=8_030_000_000, active_params=7_500_000_000, layers=32,
                  hidden=4096, seq_len=131072, kv_width=1024)  # fmt: skip
    rate = 1e15 * 0.4
    kv = 2 * 131072 * 1024  # K and V of the whole sequence
    gather = nccl.seconds("all_gather", 2 * kv, 8, hw.fabric, per_node=8)
    grads = nccl.seconds("reduce_scatter", 4 * kv, 8, hw.fabric, per_node=8)
    forward = 4 * 4096 * 131072 * 16384 / rate  # the rank's attention forward
    expected = max(0, gather - forward / 8) + max(0, gather - 2 * forward / 8)
    expected += max(0, grads - 2 * forward * 7 / 8)
    assert ring_seconds(shape, _layout(8), hw, rate) == pytest.approx(expected)
    # hidden behind attention over NVLink at this length; exposed on a slow link
    assert ring_seconds(shape, _layout(8), hw, rate) == 0.0
    slow = cluster("h100", gpus_per_node=1, nodes=16, inter_node_gbps=1)
    # one cp rank a node: the exchange crosses the 1 Gb/s network and is exposed
    gather = nccl.seconds("all_gather", 2 * kv, 8, slow.fabric, per_node=1)
    grads = nccl.seconds("reduce_scatter", 4 * kv, 8, slow.fabric, per_node=1)
    exposed = max(0, gather - forward / 8) + max(0, gather - 2 * forward / 8)
    exposed += max(0, grads - 2 * forward * 7 / 8)
    assert exposed > 1.0  # seconds: far above the attention it overlaps
    assert ring_seconds(shape, _layout(8), slow, rate) == pytest.approx(exposed)
    # full recomputation gathers again in the recomputed forward
    again = max(0, gather - forward / 8)
    assert ring_seconds(shape, _layout(8, "full"), slow, rate) == pytest.approx(exposed + again)
    t = step_time(shape, _layout(8), slow, efficiency=0.4)
    assert t.context_parallel > 0 and "context-parallel K/V exchange (exposed)" in t.terms
    assert t.step_seconds == pytest.approx(sum(t.terms.values()))
    plain = step_time(shape, _layout(1), slow, efficiency=0.4)
    assert plain.context_parallel == 0 and "context-parallel K/V exchange (exposed)" not in (
        plain.terms
    )


def test_compile_and_float8_speed_up_all_but_the_attention_core() -> None:
    from workbench.estimate.flops import flop_count_of
    from workbench.estimate.presets import find_model
    from workbench.planner.steptime import _MEASURED_STEP, MEASURED_ATTENTION_SHARE, linear_factors

    arch = find_model("llama-3-8b").architecture.replace(seq_len=8192)
    assert flop_count_of(arch) == _MEASURED_STEP  # torchtitan's Table 1 step
    # 16 L q s of 6 N + 16 L q s a token (selective recomputation runs the core again)
    core = 16 * 32 * 4096 * 8192
    a = core / (6 * 7_504_924_672 + core)
    assert pytest.approx(a) == MEASURED_ATTENTION_SHARE and round(a, 3) == 0.276
    c = (1 - a) / (1 / (6667 / 5762) - a)
    a2 = a * 6667 / 5762
    f = (1 - a2) / (1 / (8532 / 6667) - a2)
    assert linear_factors("h100-80gb", compiled=True, float8=False) == pytest.approx(c)
    assert linear_factors("h100-80gb", compiled=True, float8=True) == pytest.approx(c * f)
    assert round(c, 3) == 1.231 and round(f, 3) == 1.473
