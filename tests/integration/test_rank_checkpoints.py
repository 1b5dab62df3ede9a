"""A 2-rank checkpoint holds the full, gathered state on every rank (docs/checkpoints.md,
README "FSDP checkpoints are the workbench's own format (the full state, gathered on every
rank)"): opened as a user would (`torch.load(weights_only=True)`, its manifest's SHA-256),
each rank's file has every parameter and Adam moment at the module's own shape, the two
ranks' files hold the same tensors, and FSDP (dim-0 shards) and ZeRO-3 (flat partitions)
save the same trained weights. A rank that saved only its shard fails every one of these."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
import torch

from workbench.config import TrainConfig
from workbench.models import build_model
from workbench.train.launch import launch_ranks

#: first dimensions 33, 33, 5: neither ZeRO-3's flat partitions nor FSDP2's dim-0 shards
#: of 2 ranks split them evenly
MLP = {"in_features": 15, "hidden": 33, "depth": 2, "out_features": 5, "samples": 256}
STEPS = 3
ENGINES = {"fsdp": {"fsdp": "full_shard"}, "zero3": {"zero_stage": 3}}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each engine trained for STEPS steps on 2 ranks, a checkpoint saved at the last:
    per engine, the two ranks' payloads and manifests."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, extra in ENGINES.items():
        folder = tmp_path_factory.mktemp(name)
        config = TrainConfig(
            device="cpu",
            micro_batch=4,
            checkpoint_dir=str(folder),
            checkpoint_every_steps=STEPS,
            **extra,
        )
        result = launch_ranks(
            config, ranks=2, model="mlp", model_options=MLP, steps=STEPS, timeout=420
        )
        assert result.ok, result.first_error
        ranks = []
        for r in (0, 1):
            path = folder / f"rank-{r}" / f"step-{STEPS:08d}.pt"
            manifest = json.loads(path.with_suffix(".json").read_text())
            ranks.append(
                {
                    "path": path,
                    "manifest": manifest,
                    "payload": torch.load(path, weights_only=True),
                    "losses": [x.loss for x in result.ranks[r].records],
                }
            )
        out[name] = ranks
    return out


def _module() -> torch.nn.Module:
    return build_model("mlp", seed=0, **MLP)[0]  # the launch's model: seed 0


@pytest.mark.parametrize("engine", list(ENGINES))
def test_each_ranks_checkpoint_holds_the_full_state(
    saved: dict[str, list[dict[str, Any]]], engine: str
) -> None:
    initial = dict(_module().named_parameters())
    ranks = saved[engine]
    for r, entry in enumerate(ranks):
        manifest, payload = entry["manifest"], entry["payload"]
        assert manifest["world_size"] == 2 and manifest["rank"] == r
        assert manifest["sha256"] == hashlib.sha256(entry["path"].read_bytes()).hexdigest()
        assert payload["step"] == STEPS
        weights = payload["backend"]["model"]
        moments = payload["backend"]["optimizer"]["state"]
        assert weights.keys() == initial.keys() == moments.keys()
        for name, start in initial.items():
            w = weights[name]
            assert w.shape == start.shape and w.dtype == torch.float32, (r, name, w.shape)
            assert not torch.equal(w, start.detach()), (r, name)  # trained
            for key in ("exp_avg", "exp_avg_sq"):
                m = moments[name][key]
                assert m.shape == start.shape and bool(m.abs().sum() > 0), (r, name, key)
            assert float(moments[name]["step"]) == STEPS
    # the same full tensors in both ranks' files (each rank trained its own half of the
    # batch: their losses differ, their averaged-gradient weights do not)
    assert ranks[0]["losses"] != ranks[1]["losses"]
    a, b = (x["payload"]["backend"] for x in ranks)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(
                a["optimizer"]["state"][name][key], b["optimizer"]["state"][name][key]
            )


def test_fsdp_and_zero3_save_the_same_trained_weights(
    saved: dict[str, list[dict[str, Any]]],
) -> None:
    """Both engines average the same gradients into the same AdamW step; they shard in
    different ways, so only correctly gathered states agree (measured: bit for bit)."""
    fsdp, zero3 = (saved[e][0] for e in ("fsdp", "zero3"))
    assert fsdp["losses"] == pytest.approx(zero3["losses"], rel=1e-6)
    assert all(math.isfinite(v) for v in fsdp["losses"])
    for name, w in fsdp["payload"]["backend"]["model"].items():
        torch.testing.assert_close(w, zero3["payload"]["backend"]["model"][name], msg=name)
