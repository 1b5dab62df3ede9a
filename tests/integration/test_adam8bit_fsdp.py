"""8-bit AdamW under FSDP2 on 2 ranks (gloo, CPU): torchao's AdamW8bit steps each rank's
dim-0 shard, quantized block-wise where the shard has 4096+ elements in whole blocks, and
`session.memory()` counts what each rank holds to the byte; the state gathered from the
shards is the fp32 moments a switch or a checkpoint carries; a checkpoint saved on 2
ranks resumes into 8-bit shards again."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from tests.integration.test_adam8bit import torchao_state_bytes
from workbench import Session, TrainConfig

#: hidden 128: a 128 x 128 weight's shard is 8192 elements, quantized; biases stay fp32
GPT = {"layers": 2, "hidden": 128, "heads": 4, "seq_len": 32, "dropout": 0.0}
STEPS = 3


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 ranks (`run_ranks`): 8-bit Adam under FSDP2, saved and resumed."""
    result: dict[str, Any] = {}
    config = TrainConfig(
        device="cpu", micro_batch=4, lr=3e-3, seed=0, optimizer="adam8bit",
        fsdp="full_shard", checkpoint_dir=os.path.join(out_dir, "ckpt"),  # one for both
    )  # fmt: skip
    with Session(config, model_options=GPT) as s:
        records = s.run(optimizer_steps=STEPS)
        states = list(s.backend.optimizer.state.items())
        locals_ = [p.to_local() for p, _ in states]
        kinds = sorted({type(st["exp_avg"].to_local()).__name__ for _, st in states})
        report = s.memory()
        exported = s.backend.export_state()["optimizer"]["state"]
        path = str(s.save_checkpoint())
        result["run"] = {
            "engine": type(s.backend).__name__,
            "losses": [r.loss for r in records],
            "kinds": kinds,
            "optimizer_bytes": report.optimizer_bytes,
            "by_hand": torchao_state_bytes(locals_),
            "local_numel": sum(t.numel() for t in locals_),
            "full_numel": sum(p.numel() for p in s.model.parameters()),
            "exported_fp32": all(
                type(v) is torch.Tensor and v.dtype == torch.float32
                for st in exported.values()
                for k, v in st.items()
                if k != "step"
            ),  # fmt: skip
            "errors": [e.message for e in s.events if e.kind == "error"],
            "saved_in": os.path.relpath(path, out_dir),  # each rank its own folder
        }
    with Session.resume_from(path) as s:
        resumed = s.run(optimizer_steps=1)
        kinds = sorted({type(st["exp_avg"].to_local()).__name__
                        for st in s.backend.optimizer.state.values()})  # fmt: skip
        result["resumed"] = {"step": resumed[-1].step, "loss": resumed[-1].loss, "kinds": kinds}
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    got = run_ranks(_rank, tmp_path_factory.mktemp("adam8bit-fsdp"))
    for r, result in enumerate(got):
        assert "error" not in result, (r, result["error"])
        assert not result["run"]["errors"], (r, result["run"]["errors"])
    return got


def test_each_rank_steps_8_bit_shards_counted_to_the_byte(ranks: Any) -> None:
    for r, result in enumerate(ranks):
        run = result["run"]
        assert run["engine"] == "FSDPBackend"
        assert all(math.isfinite(v) for v in run["losses"]) and run["losses"][-1] < run["losses"][0]
        assert "OptimState8bit" in run["kinds"]  # the large shards quantized
        assert run["local_numel"] * 2 == run["full_numel"]  # half of every tensor a rank
        assert run["optimizer_bytes"] == run["by_hand"], r
        assert run["exported_fp32"]


def test_a_checkpoint_of_two_ranks_resumes_into_8_bit_shards(ranks: Any) -> None:
    """Both ranks save into one checkpoint_dir, each in its own rank-<r> folder (one
    step-N.pt for both would be overwritten), and each resumes from its own file."""
    assert [r["run"]["saved_in"] for r in ranks] == [
        os.path.join("ckpt", f"rank-{r}", "step-00000003.pt") for r in (0, 1)
    ]
    for result in ranks:
        resumed = result["resumed"]
        assert resumed["step"] == STEPS + 1 and math.isfinite(resumed["loss"])
        assert "OptimState8bit" in resumed["kinds"]  # quantized again, not fp32 DTensors
