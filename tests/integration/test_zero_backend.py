"""DeepSpeedBackend in this process on CPU (gloo): stages 0-3, state carried into a new
engine, teardown. Live switches and the RSS bound are tested through the Session in
test_zero_session.py."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from workbench.config import TrainConfig
from workbench.train.backends.base import Backend, ModelStateBytes
from workbench.train.backends.deepspeed import DeepSpeedBackend

ACCUM = 2


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step * 10 + micro)
    x = torch.randn(4, 8, generator=g)
    return x, 0.1 * x.sum(1, keepdim=True)


def train(backend: Backend, steps: int, start: int = 0) -> list[float]:
    """The contract's loop (workbench/train/backends/base.py)."""
    losses = []
    for step in range(start, start + steps):
        total = 0.0
        for micro in range(ACCUM):
            x, y = batch(step, micro)
            with backend.autocast():
                out = backend.module(x)
            loss = nn.functional.mse_loss(out.float(), y)
            backend.backward(loss)
            total += float(loss.detach())
        outcome = backend.step()
        assert not outcome.skipped
        assert outcome.grad_norm is not None and outcome.grad_norm > 0
        losses.append(total / ACCUM)
    return losses


def eval_loss(backend: Backend) -> float:
    x, y = batch(999, 0)
    with torch.no_grad(), backend.autocast():
        out = backend.module(x)
    return float(nn.functional.mse_loss(out.float(), y))


def cfg(**kw: object) -> TrainConfig:
    return TrainConfig(micro_batch=4, grad_accum=ACCUM, lr=1e-2, **kw)  # type: ignore[arg-type]


# Each stage once, bf16 on a sharded and on the partitioned-parameter stage. Stage switches
# and their loss continuity through a Session are in test_zero_session.py.
@pytest.mark.parametrize(
    ("stage", "precision"), [(0, "fp32"), (1, "bf16"), (2, "fp32"), (3, "bf16")]
)
def test_stages_train_and_continue_exactly(stage: int, precision: str) -> None:
    config = cfg(zero_stage=stage, precision=precision)
    # Reference: 5 uninterrupted steps.
    with DeepSpeedBackend(config, tiny_model()) as ref:
        assert isinstance(ref, Backend)
        before = eval_loss(ref)
        expected = train(ref, 5)
        assert eval_loss(ref) < before  # it learns
        mem = ref.model_state_bytes()
    assert isinstance(mem, ModelStateBytes)
    assert mem.params_bytes > 0 and mem.grads_bytes > 0 and mem.optimizer_bytes > 0
    # 3 steps, export, a fresh engine from the state, 2 more steps: same losses.
    first = DeepSpeedBackend(config, tiny_model())
    got = train(first, 3)
    state = first.export_state()
    second = DeepSpeedBackend(config, tiny_model(), state=state)
    first.close()
    got += train(second, 2, start=3)
    second.close()
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_bf16_halves_weight_bytes_and_keeps_fp32_master() -> None:
    n = sum(p.numel() for p in tiny_model().parameters())
    with DeepSpeedBackend(cfg(zero_stage=1, precision="bf16"), tiny_model()) as b:
        train(b, 1)
        mem = b.model_state_bytes()
        state = b.export_state()
    assert mem.params_bytes == 2 * n
    # fp32 master (4) + exp_avg (4) + exp_avg_sq (4) per parameter, one rank
    assert mem.optimizer_bytes >= 12 * n
    assert all(t.dtype == torch.float32 for t in state["model"].values())


def test_close_releases_process_group_and_environment() -> None:
    before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    b = DeepSpeedBackend(cfg(zero_stage=2), tiny_model())
    assert torch.distributed.is_initialized()
    b.close()
    b.close()  # idempotent
    assert not torch.distributed.is_initialized()
    assert {k: os.environ.get(k) for k in before} == before
    # and a next backend works
    with DeepSpeedBackend(cfg(zero_stage=3), tiny_model()) as again:
        train(again, 1)


def test_failed_build_leaves_old_backend_training() -> None:
    model = tiny_model()
    old = DeepSpeedBackend(cfg(zero_stage=1), model)
    train(old, 1)
    bad_state = old.export_state()
    bad_state["model"] = dict(bad_state["model"])
    bad_state["model"]["0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"0\.weight has shape \(3, 3\)"):
        DeepSpeedBackend(cfg(zero_stage=2), model, state=bad_state)
    assert torch.distributed.is_initialized()  # still the old backend's group
    train(old, 1, start=1)
    old.close()
    assert not torch.distributed.is_initialized()


def test_unsupported_settings_are_named() -> None:
    with pytest.raises(ValueError, match="precision='amp-fp16'"):
        DeepSpeedBackend(cfg(zero_stage=1, precision="amp-fp16"), tiny_model())
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="config="):
        DeepSpeedBackend({"zero_stage": 1}, tiny_model())  # type: ignore[arg-type]


def test_amp_bf16_with_zero_uses_autocast() -> None:
    with DeepSpeedBackend(cfg(zero_stage=2, precision="amp-bf16"), tiny_model()) as b:
        x, _ = batch(0, 0)
        with b.autocast():
            out = b.module(x)
        assert out.dtype == torch.bfloat16
        before = eval_loss(b)
        train(b, 5)
        assert eval_loss(b) < before


@pytest.mark.parametrize("stage", [1, 2])
def test_gradient_bytes_are_counted_between_micro_batches(stage: int) -> None:
    """Mid-accumulation (what Session.memory()'s probe sees) DeepSpeed holds each
    parameter's full gradient; at the boundary the reduced partition (one rank: all)."""
    n = sum(p.numel() for p in tiny_model().parameters())
    with DeepSpeedBackend(cfg(zero_stage=stage), tiny_model()) as b:
        x, _ = batch(0, 0)
        b.backward(nn.functional.mse_loss(b.module(x), 0.1 * x.sum(1, keepdim=True)))
        assert b.model_state_bytes().grads_bytes == 4 * n  # fp32, before the boundary
        x, _ = batch(0, 1)
        b.backward(nn.functional.mse_loss(b.module(x), 0.1 * x.sum(1, keepdim=True)))
        at_boundary = b.model_state_bytes().grads_bytes
        assert 4 * n <= at_boundary <= 4 * (n + 16)  # the partition, with alignment padding


def test_stage_zero_bf16_carries_fp32_masters_and_moments_by_name() -> None:
    """DeepSpeed 16-bit at stage 0 with torch's Adam runs the unfused optimizer, which keeps
    one fp32 master per parameter and keys Adam's moments by the masters: the exported state
    must be those (not the bf16 weights) and a new engine must start from them exactly."""
    with DeepSpeedBackend(cfg(zero_stage=0, precision="bf16"), tiny_model()) as b:
        assert type(b.engine.optimizer).__name__ == "FP16_UnfusedOptimizer"
        assert isinstance(b.engine.optimizer.optimizer, torch.optim.AdamW)  # torch_adam
        train(b, 2)
        state = b.export_state()
        masters = [m for _, _, m in b._unfused_pairs()]
        bf16 = [p for _, p in b.engine.module.named_parameters()]
        assert all(p.dtype == torch.bfloat16 for p in bf16)
    for (name, w), master in zip(state["model"].items(), masters, strict=True):
        assert w.dtype == torch.float32 and torch.equal(w, master), name
    assert any(not torch.equal(w, w.bfloat16().float()) for w in state["model"].values())
    moments = state["optimizer"]["state"]
    assert set(moments) == set(state["model"])
    assert all(moments[n]["exp_avg"].abs().sum() > 0 for n in moments)
    with DeepSpeedBackend(cfg(zero_stage=0, precision="bf16"), tiny_model(), state=state) as b2:
        again = b2.export_state()
    for name in state["model"]:
        assert torch.equal(again["model"][name], state["model"][name]), name
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(again["optimizer"]["state"][name][k], moments[name][k]), name


def test_engine_config_avoids_op_builds_and_deepspeeds_default_clipping() -> None:
    """torch's Adam inside DeepSpeed (no FusedAdam build, which needs nvcc on CUDA), SGD
    allowed under ZeRO, and clipping off unless asked (DeepSpeed clips at 1.0 by default)."""
    from workbench.train.backends.deepspeed import engine_config

    adam = engine_config(cfg(zero_stage=2), world_size=1, n_params=100)
    assert adam["optimizer"]["params"]["torch_adam"] is True
    assert adam["gradient_clipping"] == 0.0
    sgd = engine_config(cfg(zero_stage=3, optimizer="sgd"), world_size=1, n_params=100)
    assert sgd["zero_allow_untested_optimizer"] is True
    clipped = engine_config(cfg(zero_stage=1, clip_grad_norm=0.5), world_size=1, n_params=100)
    assert clipped["gradient_clipping"] == 0.5
