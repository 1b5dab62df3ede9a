"""QLoRA under FSDP2 on 2 CPU ranks (gloo), the way torchtune runs it: the 4-bit base is
torchao's NF4 tensor, which FSDP2 shards like any parameter and gathers through the
tensor's own `fsdp_pre_all_gather` / `fsdp_post_all_gather`.

One spawn of 2 processes trains the built-in GPT (2 layers, hidden 256: each 4-bit weight
a multiple of 64 x 256 x 2 weights, as torchao's even split needs) in pure bf16 with
full_shard. Held here: the losses are finite and fall on both ranks; each rank holds NF4
shards; its gradients and optimizer states equal the estimator's per-rank share to the
byte, and its parameters equal it plus the NF4 scale mean and code every rank keeps whole
(17 x 2 bytes a 4-bit layer, half of it in the share: 8 layers x 34 / 2 = 136 bytes); your
module gets its own fp32 layers back at close. One rank is refused by name (torch's FSDP2
skips the NF4 gather hooks on a one-rank mesh)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig

SMALL = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 32}
FOUR_BIT_LAYERS = 2 * 4  # qkv, proj, fc, fc_proj per block
REPLICATED = FOUR_BIT_LAYERS * 17 * 2 // 2  # bf16 scale mean + code, whole on each rank


def _config(**kw: Any) -> TrainConfig:
    return TrainConfig(
        device="cpu",
        micro_batch=4,
        seed=0,
        lora_rank=8,
        qlora=True,
        lr=1e-2,
        fsdp="full_shard",
        precision="bf16-true",
        **kw,
    )


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 ranks (`run_ranks`): QLoRA under FSDP2, then your module back."""
    from workbench.models import build_model
    from workbench.train.techniques.lora import parameter_bytes_by_dtype

    result: dict[str, Any] = {}
    model, data, loss, _ = build_model("tiny-gpt", **SMALL)  # type: ignore[arg-type]
    s = Session(_config(), model=model, data=data, loss_fn=loss)
    try:
        losses = [r.loss for r in s.run(3, progress=False)]
        report = s.memory()
        weight = s.backend.trained_module.blocks[0].attn.qkv.base_layer.weight
        predicted = report.predicted
        result = {
            "engine": type(s.backend).__name__,
            "losses": losses,
            "local": type(getattr(weight, "_local_tensor", weight)).__name__,
            "local_rows": int(weight._local_tensor.shape[0]),
            "measured": [
                report.params_bytes,
                report.grads_bytes,
                report.optimizer_bytes - report.optimizer_step_counter_bytes,
            ],
            "predicted": None
            if predicted is None
            else [predicted.params_bytes, predicted.grads_bytes, predicted.optimizer_bytes],
            "notes": list(report.notes),
            "by_dtype": parameter_bytes_by_dtype(s.backend.trained_module),
        }
    finally:
        s.close()
    result["back"] = type(model.blocks[0].attn.qkv).__name__
    result["back_dtype"] = str(model.blocks[0].attn.qkv.weight.dtype)
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    got = run_ranks(_rank, tmp_path_factory.mktemp("qlora-fsdp"))
    for r, result in enumerate(got):
        assert "error" not in result, (r, result["error"])
    return got


def test_qlora_trains_under_fsdp2_on_two_ranks(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        assert result["engine"] == "FSDPBackend"
        losses = result["losses"]
        assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
        assert result["local"] == "NF4Tensor"  # the 4-bit base itself is sharded
        assert result["local_rows"] == 3 * 256 // 2  # half of qkv's 768 output rows
        assert result["back"] == "Linear" and result["back_dtype"] == "torch.float32"
    assert ranks[0]["losses"] != ranks[1]["losses"]  # each rank its own half of the batch


def test_one_ranks_states_are_the_estimators_share(ranks: list[dict[str, Any]]) -> None:
    for result in ranks:
        assert result["predicted"] is not None, result["notes"]
        params, grads, optimizer = result["measured"]
        assert [grads, optimizer] == result["predicted"][1:]
        assert params == result["predicted"][0] + REPLICATED
        # the NF4 shards' codes (uint8), scales (int8), the rest bf16: memory()'s note
        assert set(result["by_dtype"]) == {"bfloat16", "int8", "uint8"}
        assert sum(result["by_dtype"].values()) == params


def test_one_rank_is_refused_with_the_reason() -> None:
    from workbench.engines import QLORA_FSDP_ONE_RANK, engine_problems

    found = [p for p in engine_problems(_config(), 1) if p.field == "qlora"]
    assert len(found) == 1 and found[0].message.endswith(QLORA_FSDP_ONE_RANK)
    assert "fsdp (1 rank)" in found[0].message
    assert [p for p in engine_problems(_config(), 2) if p.field == "qlora"] == []


def test_an_nf4_weight_that_does_not_split_evenly_is_named() -> None:
    from torch import nn

    from workbench.train.techniques.lora import NF4Linear, nf4_shard_problem

    model = nn.Sequential(NF4Linear(nn.Linear(256, 256), torch.bfloat16))
    assert nf4_shard_problem(model, 2) is None  # 65,536 = 2 x 64 x 256 x 2
    model.append(NF4Linear(nn.Linear(128, 128), torch.bfloat16))
    problem = nf4_shard_problem(model, 2)
    assert problem is not None
    assert "layer 1 holds 16,384 weights (128 x 128)" in problem and "32,768" in problem
