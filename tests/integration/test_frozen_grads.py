"""Frozen weights cost no gradients, on any engine: LoRA under FSDP2, DDP and ZeRO-2.

The estimator charges the gradient terms of a step (FSDP's unsharded gradients, DDP's
buckets, ZeRO's reduce buckets and gradient partitions) for the parameters that train
only: under LoRA the adapters. Held three ways:

* by hand, on Llama 3 70B over 8 GPUs (rank 16, all-linear: 2,588,672 adapter parameters
  per layer, 80 layers);
* against the dry run (2 fake ranks, tiny-gpt, rank 8): the most FSDP unsharded gradients
  alive at once in the dry run's trace, and DeepSpeed's reduce buckets, byte for byte;
* against a real step on 2 gloo ranks (tiny-gpt, rank 8): the gradients each FSDP unit
  hands to its reduce-scatter (spied on), the ZeRO-2 reduce bucket DeepSpeed allocates
  (spied on), and one rank's gradients at the step, against the Session's prediction.

Measured on this CPU (fp32, micro-batch 4 x 64): every FSDP unit reduces 65,536 bytes of
adapter gradients (16,384 adapter parameters a block; no reduce for the frozen embedding,
head or root), the estimator's 131,072-byte term is two units in flight; ZeRO-2's bucket
is 262,144 bytes (the 65,536 adapters in fp32, the bucket capped at the trained
parameters) where the full model's is 3,239,936.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.estimate import estimate_memory
from workbench.train.dry_run import simulate_memory

#: Llama 3 70B, rank 16 on every linear layer of a block: q, o 8192 x 8192; k, v 8192 x
#: 1024; gate, up, down 8192 x 28672
LAYER_ADAPTERS_70B = 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024) + 3 * (8192 + 28672))
MB = 4


def _most(moments: dict[str, dict[str, int]], term: str) -> int:
    return max(terms.get(term, 0) for terms in moments.values())


def _70b(**kw: Any) -> Any:
    return estimate_memory(
        model="llama-3-70b", gpus=8, micro_batch=1, seq_len=2048, precision="amp-bf16",
        checkpointing="full", **kw,
    )  # fmt: skip


def test_lora_on_a_70b_over_8_gpus_is_charged_the_adapters_gradients_only() -> None:
    assert LAYER_ADAPTERS_70B == 2_588_672
    lora = _70b(lora_rank=16, fsdp="full_shard")
    assert lora.lora_params == 80 * LAYER_ADAPTERS_70B
    # two layers' adapter gradients in bf16 and one layer's fp32 reduce copy; no head's
    assert _most(lora.peak.moments, "FSDP unsharded gradients") == 8 * LAYER_ADAPTERS_70B
    assert lora.peak.moments["backward end"]["FSDP unsharded gradients"] == 0
    full = _70b(fsdp="full_shard")
    assert _most(full.peak.moments, "FSDP unsharded gradients") > 8 * 2**30
    # DDP's buckets and ZeRO-2's reduce bucket and fp32 partition: the adapters'
    adapters = lora.lora_params
    ddp = _70b(lora_rank=16)
    assert ddp.peak.moments["backward end"]["DDP gradient buckets"] == 4 * adapters
    zero2 = _70b(lora_rank=16, zero_stage=2)
    assert _most(zero2.peak.moments, "DeepSpeed reduce buckets") == 4 * (-(-adapters // 64) * 64)
    bf16 = estimate_memory(
        model="llama-3-70b", gpus=8, micro_batch=1, seq_len=2048, precision="bf16",
        zero_stage=2, lora_rank=16,
    )  # fmt: skip
    assert bf16.peak.points["optimizer step"]["DeepSpeed fp32 gradient partition"] == 4 * -(
        -adapters // 8
    )


def _trace_most(run: Any, category: str) -> int:
    """The most bytes of `category` alive at once in a dry run's trace."""
    sizes: dict[int, int] = {}
    now = best = 0
    for e in run.trace.events:
        if e.kind == "alloc" and e.category == category:
            sizes[e.block] = e.nbytes
            now += e.nbytes
        elif e.kind == "free" and e.block in sizes:
            now -= sizes.pop(e.block)
        best = max(best, now)
    return best


@pytest.mark.parametrize("mode", ["full_shard", "shard_grad_op"])
def test_the_dry_runs_fsdp_unsharded_gradients_are_the_adapters(mode: str) -> None:
    config = TrainConfig(micro_batch=MB, seed=0, lora_rank=8, fsdp=mode)
    run = simulate_memory("tiny-gpt", config, world_size=2, progress=False)
    formula = run.formula
    assert _trace_most(run, "unsharded gradients") == 131_072
    assert _most(formula.peak.moments, "FSDP unsharded gradients") == 131_072
    assert (run.grads_bytes, run.params_bytes) == (formula.grads_bytes, formula.params_bytes)
    assert (
        run.points["optimizer step"]["optimizer step temporaries"]
        == formula.peak.points["optimizer step"]["optimizer step temporaries"]
    )


def test_the_dry_runs_zero2_reduce_bucket_is_the_adapters() -> None:
    config = TrainConfig(micro_batch=MB, seed=0, lora_rank=8, zero_stage=2)
    run = simulate_memory("tiny-gpt", config, world_size=2, progress=False)
    formula = run.formula
    assert run.points["backward"]["DeepSpeed reduce buckets"] == 262_144
    assert _most(formula.peak.moments, "DeepSpeed reduce buckets") == 262_144
    assert run.grads_bytes == formula.grads_bytes == 131_072


#: name -> settings of the real 2-rank runs
RUNS: dict[str, dict[str, Any]] = {
    "fsdp lora": {"fsdp": "full_shard", "lora_rank": 8},
    "fsdp full": {"fsdp": "full_shard"},
    "zero2 lora": {"zero_stage": 2, "lora_rank": 8},
}


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 ranks: each of RUNS for 2 steps; the gradients each FSDP unit reduces and
    the ZeRO-2 buckets DeepSpeed allocates (spied on), the predicted terms."""
    from deepspeed.runtime.zero import stage_1_and_2
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    reduced: list[int] = []
    buckets: list[int] = []
    real_reduce = _fsdp_param_group.foreach_reduce
    zero = stage_1_and_2.DeepSpeedZeroOptimizer
    real_epilogue = zero.independent_gradient_partition_epilogue

    def spy_reduce(params: Any, grads: list[torch.Tensor], *args: Any, **kw: Any) -> Any:
        reduced.append(sum(g.numel() * g.element_size() for g in grads))
        return real_reduce(params, grads, *args, **kw)

    def spy_epilogue(self: Any) -> Any:
        buckets.append(
            sum(b.numel() * b.element_size() for k in self.ipg_buckets.values() for b in k.buffer)
        )
        return real_epilogue(self)

    _fsdp_param_group.foreach_reduce = spy_reduce
    zero.independent_gradient_partition_epilogue = spy_epilogue
    result: dict[str, Any] = {}
    try:
        for name, settings in RUNS.items():
            reduced.clear()
            buckets.clear()
            config = TrainConfig(device="cpu", micro_batch=MB, seed=0, **settings)
            with Session(config) as s:
                s.run(optimizer_steps=2, progress=False)
                report = s.memory()
                peak = report.predicted.peak
                result[name] = {
                    "reduced": list(reduced),
                    "buckets": list(buckets),
                    "grads_bytes": report.grads_bytes,
                    "predicted_grads_bytes": report.predicted.grads_bytes,
                    "unsharded": _most(peak.moments, "FSDP unsharded gradients"),
                    "reduce_buckets": _most(peak.moments, "DeepSpeed reduce buckets"),
                    "blocks": len(s.model.blocks),
                }
    finally:
        _fsdp_param_group.foreach_reduce = real_reduce
        zero.independent_gradient_partition_epilogue = real_epilogue
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    got = run_ranks(_rank, tmp_path_factory.mktemp("frozen-grads"))
    for r in got:
        assert "error" not in r, r["error"]
    return got


def test_fsdp_units_reduce_the_adapters_gradients_only_on_two_ranks(ranks: Any) -> None:
    for r in ranks:
        lora, full = r["fsdp lora"], r["fsdp full"]
        blocks = lora["blocks"]
        # one reduce per block per backward (the frozen embedding, head and root reduce
        # nothing), each the block's adapter gradients whole: 16,384 fp32 parameters
        assert set(lora["reduced"]) == {65_536}
        assert len(lora["reduced"]) % blocks == 0 and len(lora["reduced"]) >= 2 * blocks
        # the estimator's term: two units' unsharded gradients in flight
        assert lora["unsharded"] == 2 * max(lora["reduced"])
        assert lora["grads_bytes"] == lora["predicted_grads_bytes"]
        # the full fine-tune reduces every weight, the root's too
        assert sum(full["reduced"]) > 10 * sum(lora["reduced"])


def test_zero2_reduces_through_a_bucket_of_the_adapters_on_two_ranks(ranks: Any) -> None:
    for r in ranks:
        run = r["zero2 lora"]
        # one bucket per backward, the adapters in fp32
        assert set(run["buckets"]) == {262_144} and len(run["buckets"]) >= 2
        assert run["reduce_buckets"] == 262_144
        assert run["grads_bytes"] == run["predicted_grads_bytes"] == 131_072
