"""PyTorch FSDP2 as the second sharding engine, in this process (CPU, gloo, world size 1)
and on 2 ranks: the same curve as the plain loop in every mode, live switches between the
plain loop, FSDP and ZeRO-3 carrying weights and optimizer state, mixed precision, memory
measured against the "fsdp" accounting, your module's weights, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.rank_runs import run_ranks
from workbench import Session, TrainConfig
from workbench.train.backends import deepspeed as zero
from workbench.train.backends.fsdp import FSDPBackend
from workbench.train.backends.plain import PlainBackend
from workbench.train.records import StepRecord

MLP = {"in_features": 8, "hidden": 16, "depth": 2, "out_features": 4, "samples": 512}
TINY = {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16}
STEPS = 8


def config(**kw: object) -> TrainConfig:
    base: dict[str, object] = {"micro_batch": 8, "grad_accum": 2, "lr": 1e-2, "seed": 1}
    base.update(kw)
    return TrainConfig(**base)  # type: ignore[arg-type]


def losses(records: list[StepRecord]) -> list[float]:
    return [r.loss for r in records]


@pytest.fixture(scope="module")
def reference() -> list[float]:
    """The plain loop's losses: one rank in fp32, FSDP only changes where states live."""
    with Session(config(), model="mlp", model_options=MLP) as s:
        return losses(s.run(optimizer_steps=STEPS))


@pytest.mark.parametrize("mode", ["full_shard", "shard_grad_op", "no_shard"])
def test_each_fsdp_mode_trains_on_the_plain_loops_curve(mode: str, reference: list[float]) -> None:
    with Session(config(fsdp=mode), model="mlp", model_options=MLP) as s:
        assert isinstance(s.backend, FSDPBackend)
        params = list(s.model.parameters())
        assert all(type(p).__name__ == "DTensor" for p in params)  # really sharded by FSDP2
        records = s.run(optimizer_steps=STEPS)
        assert all(r.fsdp == mode and r.zero_stage == 0 for r in records)
        assert losses(records) == pytest.approx(reference, rel=1e-5, abs=1e-7)
    assert not torch.distributed.is_initialized()  # the lease gave the group back


def test_live_switches_plain_fsdp_zero3_plain_match_a_run_that_never_switched(
    reference: list[float],
) -> None:
    with Session(config(), model="mlp", model_options=MLP) as s:
        got = losses(s.run(optimizer_steps=2))
        s.update(fsdp="full_shard")
        assert isinstance(s.backend, FSDPBackend)
        got += losses(s.run(optimizer_steps=2))
        s.update(fsdp="off", zero_stage=3)  # FSDP's process group is DeepSpeed's now
        assert s.backend.engine.zero_optimization_stage() == 3
        got += losses(s.run(optimizer_steps=2))
        s.update(zero_stage=0)
        assert isinstance(s.backend, PlainBackend)
        got += losses(s.run(optimizer_steps=2))
        kinds = [r.changes for r in s.history if r.changes]
        assert kinds == [
            {"fsdp": "full_shard"},
            {"fsdp": "off", "zero_stage": 3},
            {"zero_stage": 0},
        ]
    assert got == pytest.approx(reference, rel=1e-5, abs=1e-7)
    assert not torch.distributed.is_initialized()


def test_a_failed_fsdp_build_keeps_the_old_engine_training(
    monkeypatch: pytest.MonkeyPatch, reference: list[float]
) -> None:
    def fail(self: FSDPBackend, model: torch.nn.Module, state: object) -> None:
        raise RuntimeError("fsdp build failed on purpose")

    with Session(config(zero_stage=2), model="mlp", model_options=MLP) as s:
        old = s.backend
        got = losses(s.run(optimizer_steps=3))
        monkeypatch.setattr(FSDPBackend, "_build", fail)
        with pytest.raises(ValueError, match="fsdp build failed on purpose"):
            s.update(zero_stage=0, fsdp="full_shard")
        assert s.backend is old and s.config.zero_stage == 2 and s.config.fsdp == "off"
        got += losses(s.run(optimizer_steps=3))
    assert got == pytest.approx(reference[:6], rel=1e-5, abs=1e-7)


def test_mixed_precision_policy_and_loss_scaling() -> None:
    """amp-bf16: 16-bit compute on gathered copies, fp32 shards at rest; amp-fp16 adds
    torch's GradScaler over the sharded gradients."""
    dtypes: list[torch.dtype] = []
    with Session(
        config(fsdp="full_shard", precision="amp-bf16"), model="tiny-gpt", model_options=TINY
    ) as s:
        block = s.model.blocks[0]  # type: ignore[index]
        block.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        records = s.run(optimizer_steps=2)
        assert all(p.dtype == torch.float32 for p in s.model.parameters())  # the shards
        assert all(math.isfinite(r.loss) for r in records)
    assert dtypes and all(d == torch.bfloat16 for d in dtypes)
    with Session(
        config(fsdp="full_shard", precision="amp-fp16"), model="tiny-gpt", model_options=TINY
    ) as s:
        records = s.run(optimizer_steps=2)
        assert records[-1].scale == 2.0**16 and not records[-1].skipped


def test_memory_is_the_fsdp_accounting_in_one_process() -> None:
    """World size 1: no padding, so measured model states equal FSDP2's layout exactly
    (fp32 shards, fp32 gradients, Adam's two moments; no master copy)."""
    with Session(config(fsdp="full_shard"), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=1)
        report = s.memory()
    pred = report.predicted
    assert pred is not None and pred.accounting == "fsdp" and pred.fsdp == "full_shard"
    assert report.params_bytes == pred.params_bytes == 4 * report.n_params
    assert report.grads_bytes == pred.grads_bytes
    assert report.optimizer_bytes - report.optimizer_step_counter_bytes == pred.optimizer_bytes


def test_your_module_gets_the_trained_weights(reference: list[float]) -> None:
    from workbench.models import build_model

    module = build_model("mlp", seed=1, **MLP)[0]
    with Session(config(), model="mlp", model_options=MLP) as plain:
        plain.run(optimizer_steps=3)
        want = plain.state_dict()
    data = build_model("mlp", seed=1, **MLP)[1]
    loss = build_model("mlp", seed=1, **MLP)[2]
    with Session(config(fsdp="full_shard"), model=module, data=data, loss_fn=loss) as s:
        s.run(optimizer_steps=3)
    for name, value in module.state_dict().items():
        assert type(value).__name__ == "Tensor" and value.dtype == torch.float32, name
        torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-6, msg=name)


def test_checkpoint_and_resume_under_fsdp(tmp_path: Path) -> None:
    with Session(config(fsdp="full_shard"), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=3)
        path = s.save_checkpoint(tmp_path)
        after = losses(s.run(optimizer_steps=3))
    with Session.resume_from(path) as r:
        assert isinstance(r.backend, FSDPBackend) and r.step == 3
        assert losses(r.run(optimizer_steps=3)) == after  # bit for bit


def test_fsdp_settings_are_checked_up_front() -> None:
    with pytest.raises(ValueError, match="PyTorch FSDP and DeepSpeed ZeRO are two sharding"):
        TrainConfig(fsdp="full_shard", zero_stage=3)
    with pytest.raises(ValueError, match="precision='bf16' is DeepSpeed's 16-bit mode"):
        TrainConfig(fsdp="full_shard", precision="bf16")
    with pytest.raises(ValueError, match="fsdp='sharded': must be one of off, full_shard"):
        TrainConfig(fsdp="sharded")
    with pytest.raises(ValueError, match="offload_params='cpu': FSDP offloads to 'cpu' with"):
        TrainConfig(fsdp="shard_grad_op", offload_params="cpu")
    with pytest.raises(
        ValueError, match="sharding_strategy='FULL_SHARD': unknown setting; did you mean 'fsdp'"
    ):
        TrainConfig(sharding_strategy="FULL_SHARD")  # type: ignore[call-arg]


def test_zero3_engine_and_fsdp_engine_leave_no_patch_behind() -> None:
    original = torch.nn.functional.linear
    with Session(config(zero_stage=3), model="mlp", model_options=MLP) as s:
        s.run(optimizer_steps=1)
        s.update(zero_stage=0, fsdp="full_shard")
        s.run(optimizer_steps=1)
    assert torch.nn.functional.linear is original
    assert zero.Zero3LinearPatch.engines == 0


# --------------------------------------------------------------------------- GPU readiness
def _offload_rank(rank: int, out_dir: str) -> dict[str, Any]:
    """One of 2 ranks: FSDP with CPU offload over a default group that has no backend for
    host tensors ("cuda:gloo" stands in for the NCCL-only group a launcher or DeepSpeed
    makes: a CPU tensor reduced over it fails with "No backend type associated with device
    type cpu", as over NCCL)."""
    cfg = config(
        fsdp="full_shard",
        offload_params="cpu",
        precision="amp-fp16",  # the GradScaler's found-inf flag is reduced
        clip_grad_norm=1.0,  # the gradient norm is reduced
        device="cpu",
    )
    with Session(cfg, model="mlp", model_options=MLP) as s:
        records = s.run(optimizer_steps=2)
        state = s.backend.export_state()  # the full-state gathers
        result = {
            "losses": losses(records),
            "grad_norms": [r.grad_norm for r in records],
            "state_names": sorted(state["model"]),
            "errors": [e.message for e in s.events if e.kind == "error"],
        }
    return result


def test_cpu_offload_over_a_group_without_a_host_backend_trains_on_two_ranks(
    tmp_path: Path,
) -> None:
    ranks = run_ranks(_offload_rank, tmp_path, backend="cuda:gloo")
    for got in ranks:
        assert "error" not in got, got
        assert not got["errors"], got["errors"]
        assert len(got["losses"]) == 2 and all(math.isfinite(v) for v in got["losses"])
        assert got["state_names"] == sorted(n for n, _ in _mlp_names())
    # the norm is of the whole gradient, reduced over both ranks' shards: one value
    assert ranks[0]["grad_norms"] == ranks[1]["grad_norms"]
    assert all(math.isfinite(v) for v in ranks[0]["grad_norms"])


def _mlp_names() -> list[tuple[str, torch.nn.Parameter]]:
    from workbench.models import build_model

    return list(build_model("mlp", seed=1, **MLP)[0].named_parameters())


def test_the_lease_creates_a_cuda_group_with_a_host_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA the group FSDP's lease creates reduces CUDA tensors over NCCL and host
    tensors (CPU offload) over gloo; a CPU group stays gloo."""
    import torch.distributed as dist

    from workbench.train.backends.process_group import ProcessGroupLease

    made: list[object] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: made.append(kw["backend"]))
    for device in (torch.device("cuda", 0), torch.device("cpu")):
        ProcessGroupLease.acquire(device, deepspeed=False)
        ProcessGroupLease.release()
    assert made == ["cpu:gloo,cuda:nccl", "gloo"]


def test_every_fsdp_entry_point_runs_on_the_sessions_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP2 puts parameters, streams and buffers on the current CUDA device (per thread),
    so the backend names the session's device around building (mesh and fully_shard),
    forward (where FSDP creates its streams), the optimizer step and the state gathers."""
    import torch.distributed.device_mesh as mesh_api
    import torch.distributed.fsdp as fsdp_api

    from workbench.train.backends import fsdp as fsdp_backend

    inside: list[torch.device] = []
    seen: dict[str, list[object]] = {}

    class Scope:
        def __init__(self, device: torch.device) -> None:
            self.device = device

        def __enter__(self) -> None:
            inside.append(self.device)

        def __exit__(self, *exc: object) -> None:
            inside.pop()

    def note(what: str) -> None:
        seen.setdefault(what, []).append(inside[-1] if inside else None)

    real_shard, real_mesh = fsdp_api.fully_shard, mesh_api.init_device_mesh

    def shard(module: torch.nn.Module, **kw: object) -> object:
        note("fully_shard")
        return real_shard(module, **kw)

    def mesh(*args: object, **kw: object) -> object:
        note("mesh")
        return real_mesh(*args, **kw)

    monkeypatch.setattr(fsdp_backend, "on_device", Scope)
    monkeypatch.setattr(fsdp_api, "fully_shard", shard)
    monkeypatch.setattr(mesh_api, "init_device_mesh", mesh)
    with Session(config(fsdp="full_shard"), model="mlp", model_options=MLP) as s:
        s.model.register_forward_pre_hook(lambda *_: note("forward"))
        s.backend.optimizer.register_step_pre_hook(lambda *_: note("optimizer step"))
        s.run(optimizer_steps=1)
        s.backend.export_state()
        device = s.device
    assert set(seen) == {"fully_shard", "mesh", "forward", "optimizer step"}, seen
    for what, devices in seen.items():
        assert devices and all(d == device for d in devices), (what, devices)


@pytest.mark.gpu
def test_fsdp_trains_on_the_sessions_cuda_device_not_the_current_one() -> None:
    """Session(device="cuda:N") with FSDP: every shard, gradient and optimizer state on
    cuda:N (N = the last GPU; the current device stays cuda:0). With CPU offload over
    NCCL the step and the full-state gathers run (the host tensors over gloo)."""
    last = torch.cuda.device_count() - 1
    torch.cuda.set_device(0)
    with Session(
        config(fsdp="full_shard", device="cuda"),
        model="mlp",
        model_options=MLP,
        device=f"cuda:{last}",
    ) as s:
        records = s.run(optimizer_steps=2)
        assert str(s.device) == f"cuda:{last}"
        local = [getattr(p, "_local_tensor", p) for p in s.model.parameters()]
        assert {str(t.device) for t in local} == {f"cuda:{last}"}
        states = [v for st in s.backend.optimizer.state.values() for v in st.values()]
        assert {str(getattr(v, "_local_tensor", v).device) for v in states if v.dim() > 0} == {
            f"cuda:{last}"
        }
        assert all(math.isfinite(r.loss) for r in records)
    assert torch.cuda.current_device() == 0
    cfg = config(
        fsdp="full_shard",
        offload_params="cpu",
        precision="amp-fp16",
        clip_grad_norm=1.0,
        device="cuda",
    )
    with Session(cfg, model="mlp", model_options=MLP) as s:
        records = s.run(optimizer_steps=2)
        assert all(math.isfinite(r.loss) for r in records), s.events[-3:]
        assert {str(getattr(p, "_local_tensor", p).device) for p in s.model.parameters()} == {"cpu"}
        s.update(fsdp="off", offload_params="none", zero_stage=3, precision="fp16")
        records = s.run(optimizer_steps=1)
        assert all(math.isfinite(r.loss) for r in records), s.events[-3:]
        # back into offload with the optimizer state carried: the states beside the shards
        s.update(fsdp="full_shard", offload_params="cpu", zero_stage=0, precision="amp-fp16")
        records = s.run(optimizer_steps=1)
        assert all(math.isfinite(r.loss) for r in records), s.events[-3:]
        states = [v for st in s.backend.optimizer.state.values() for v in st.values()]
        assert {str(getattr(v, "_local_tensor", v).device) for v in states if v.dim() > 0} == {
            "cpu"
        }
