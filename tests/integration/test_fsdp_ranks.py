"""FSDP2 on 2 ranks (gloo, CPU), where its modes differ: full_shard, shard_grad_op and
no_shard train the same trajectory (they differ in when parameters are gathered, not in
the arithmetic) and gather the same full state; full_shard and shard_grad_op keep half
the parameters on each rank at rest, no_shard all of them; CPU offload trains the same
trajectory; `fsdp_reduce_fp32` decides the dtype the gradients are reduced in.

One spawn of 2 processes runs every configuration in turn (a spawn costs seconds of
start-up; each configuration a fraction of a second)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 512}
STEPS = 3
#: name -> settings; every one trains the MLP for STEPS optimizer steps on 2 ranks
RUNS: dict[str, dict[str, Any]] = {
    "full_shard": {"fsdp": "full_shard"},
    "shard_grad_op": {"fsdp": "shard_grad_op"},
    "no_shard": {"fsdp": "no_shard"},
    "offload": {"fsdp": "full_shard", "offload_params": "cpu"},
    "bf16 reduce fp32": {"fsdp": "full_shard", "precision": "amp-bf16"},
    "bf16 reduce bf16": {
        "fsdp": "full_shard",
        "precision": "amp-bf16",
        "fsdp_reduce_fp32": False,
    },
    "bf16-true reduce fp32": {"fsdp": "full_shard", "precision": "bf16-true"},
    "bf16-true reduce bf16": {
        "fsdp": "full_shard",
        "precision": "bf16-true",
        "fsdp_reduce_fp32": False,
    },
}


def config(**kw: Any) -> TrainConfig:
    base: dict[str, Any] = {"micro_batch": 8, "grad_accum": 2, "lr": 1e-2, "seed": 1}
    base.update(kw)
    return TrainConfig(device="cpu", **base)


def _rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of the 2 ranks: every configuration of RUNS in turn; losses, what each rank
    holds at rest, the reduce dtypes FSDP used and the gathered state go to out_dir."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    # FSDP2's gradient reduction, spied on: the dtype it reduces in (`reduce_dtype`, or
    # the gradients' own when the policy names none)
    real_reduce = _fsdp_param_group.foreach_reduce
    reduced: list[str] = []

    def spy(params: Any, grads: list[torch.Tensor], *args: Any, **kw: Any) -> Any:
        reduce_dtype = args[4] if len(args) > 4 else kw.get("reduce_dtype")
        reduced.append(str(reduce_dtype or grads[0].dtype))
        return real_reduce(params, grads, *args, **kw)

    _fsdp_param_group.foreach_reduce = spy
    result: dict[str, Any] = {}
    try:
        for name, settings in RUNS.items():
            reduced.clear()
            with Session(config(**settings), model="mlp", model_options=MLP) as s:
                records = s.run(optimizer_steps=STEPS)
                params = list(s.model.parameters())
                local = [getattr(p, "_local_tensor", p) for p in params]
                report = s.memory()
                state = s.backend.export_state()
                result[name] = {
                    "engine": type(s.backend).__name__,
                    "world_size": s.world_size,
                    "losses": [r.loss for r in records],
                    "grad_norms": [r.grad_norm for r in records],
                    "fsdp": [r.fsdp for r in records],
                    "full_numel": sum(p.numel() for p in params),
                    "local_numel": sum(t.numel() for t in local),
                    "local_devices": sorted({str(t.device) for t in local}),
                    "params_bytes": report.params_bytes,
                    "predicted_params_bytes": None
                    if report.predicted is None
                    else report.predicted.params_bytes,
                    "reduce_dtypes": sorted(set(reduced)),
                    "errors": [e.message for e in s.events if e.kind == "error"],
                }
                torch.save(
                    {"model": state["model"], "optimizer": state["optimizer"]["state"]},
                    os.path.join(out_dir, f"{name}-rank-{rank}.pt"),
                )
    finally:
        _fsdp_param_group.foreach_reduce = real_reduce
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("fsdp-ranks")
    got = run_ranks(_rank, out)
    for r, result in enumerate(got):
        assert "error" not in result, (r, result["error"])
        for name in RUNS:
            assert not result[name]["errors"], (r, name, result[name]["errors"])
            assert result[name]["engine"] == "FSDPBackend" and result[name]["world_size"] == 2
    return got, out


def _state(out: Path, name: str, rank: int) -> dict[str, Any]:
    return torch.load(out / f"{name}-rank-{rank}.pt", weights_only=True)


def test_the_three_modes_train_one_trajectory_on_two_ranks(ranks: Any) -> None:
    """Each rank trains its own half of the batch (the two ranks' losses differ), and the
    three modes give every rank the same losses and gradient norms (gradients averaged
    over both ranks in each) and the same gathered weights and Adam moments."""
    got, out = ranks
    for r in (0, 1):
        want = got[r]["full_shard"]
        assert len(want["losses"]) == STEPS and all(math.isfinite(v) for v in want["losses"])
        for mode in ("shard_grad_op", "no_shard"):
            run = got[r][mode]
            assert run["fsdp"] == [mode] * STEPS
            assert run["losses"] == pytest.approx(want["losses"], rel=1e-5, abs=1e-7), (r, mode)
            assert run["grad_norms"] == pytest.approx(want["grad_norms"], rel=1e-5), (r, mode)
            a, b = _state(out, "full_shard", r), _state(out, mode, r)
            assert a["model"].keys() == b["model"].keys()
            for key in a["model"]:
                torch.testing.assert_close(b["model"][key], a["model"][key], msg=(mode, key))
                for moment in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(
                        b["optimizer"][key][moment], a["optimizer"][key][moment]
                    )
    assert got[0]["full_shard"]["losses"] != got[1]["full_shard"]["losses"]  # own data
    # the gradient norm is of the whole averaged gradient: one value on both ranks
    assert got[0]["full_shard"]["grad_norms"] == pytest.approx(got[1]["full_shard"]["grad_norms"])


def test_what_each_rank_holds_at_rest_per_mode(ranks: Any) -> None:
    """full_shard and shard_grad_op: half the parameters on each rank (dim-0 shards of a
    model whose every tensor has an even first dimension, so no padding); no_shard (a
    mesh of 2 replicas x 1 shard): all of them; the memory report counts what is held."""
    got, _ = ranks
    for r in (0, 1):
        full = got[r]["full_shard"]["full_numel"]
        assert full > 0
        for mode, held in (
            ("full_shard", full // 2),
            ("shard_grad_op", full // 2),
            ("no_shard", full),
        ):
            run = got[r][mode]
            assert run["local_numel"] == held, (r, mode, run["local_numel"], full)
            assert run["params_bytes"] == 4 * held, (r, mode)


def test_cpu_offload_trains_the_same_trajectory(ranks: Any) -> None:
    """offload_params="cpu" moves where the shards live (host memory; on this CPU machine
    the same place), not the arithmetic: the losses and the gathered weights are
    full_shard's."""
    got, out = ranks
    for r in (0, 1):
        off, want = got[r]["offload"], got[r]["full_shard"]
        assert off["local_devices"] == ["cpu"]
        assert off["losses"] == pytest.approx(want["losses"], rel=1e-5, abs=1e-7)
        a, b = _state(out, "full_shard", r), _state(out, "offload", r)
        for key in a["model"]:
            torch.testing.assert_close(b["model"][key], a["model"][key], msg=key)


def test_fsdp_reduce_fp32_sets_the_dtype_gradients_are_reduced_in(ranks: Any) -> None:
    """amp-bf16 and bf16-true compute gradients in bf16; with `fsdp_reduce_fp32` (the
    default) FSDP reduces them in fp32, without it in bf16. Under amp-bf16 (fp32 shards)
    the two runs differ: the average of the ranks' gradients is kept in fp32 or rounded
    to bf16. Under bf16-true the shards are bf16 and two ranks' bf16 gradients sum
    exactly in fp32, so one rounding to bf16 either way: the same weights."""
    got, out = ranks
    for r in (0, 1):
        assert got[r]["full_shard"]["reduce_dtypes"] == ["torch.float32"]
        for precision in ("bf16", "bf16-true"):
            fp32, half = got[r][f"{precision} reduce fp32"], got[r][f"{precision} reduce bf16"]
            assert fp32["reduce_dtypes"] == ["torch.float32"], (r, precision)
            assert half["reduce_dtypes"] == ["torch.bfloat16"], (r, precision)
            assert all(math.isfinite(v) for v in fp32["losses"] + half["losses"])
            a = _state(out, f"{precision} reduce fp32", r)["model"]
            b = _state(out, f"{precision} reduce bf16", r)["model"]
            differ = any(not torch.equal(a[k], b[k]) for k in a)
            assert differ is (precision == "bf16"), precision
