"""A change that is interrupted (Ctrl-C in its build) or fails to build leaves the queue of
settings changes as the user left it: nothing half-queued, nothing queued meanwhile lost."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import workbench.train.runtime as runtime
from workbench import Session, TrainConfig


def _session(**settings) -> tuple[nn.Module, Session]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
    cfg = TrainConfig(micro_batch=8, **settings)
    return model, Session(cfg, model=model, data=data, loss_fn=nn.CrossEntropyLoss())


def _failing_build(monkeypatch, precision: str, exc: BaseException) -> None:
    """`build_backend` raises `exc` for `precision`, builds anything else."""
    original = runtime.build_backend

    def build(config, *args, **kwargs):
        if str(getattr(config.precision, "value", config.precision)) == precision:
            raise exc
        return original(config, *args, **kwargs)

    monkeypatch.setattr(runtime, "build_backend", build)


def test_ctrl_c_in_update_leaves_the_session_as_before_the_update(monkeypatch):
    model, s = _session()
    with s:
        s.run(2)
        _failing_build(monkeypatch, "bf16-true", KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            s.update(precision="bf16-true")
        monkeypatch.undo()
        assert s.config.precision == "fp32" and s.pending_changes == {}
        s.update(lr=1e-3)  # changes lr only: the interrupted precision stays unapplied
        assert s.config.precision == "fp32" and s.config.lr == 1e-3
        assert s.model is model  # the plain loop trains the module itself, no bf16 copy
        [record] = s.run(1)
        assert record.changes == {"lr": 1e-3}
        changes = [e.details["changes"] for e in s.events if e.kind == "change"]
        assert changes == [{"lr": 1e-3}]


def test_ctrl_c_while_the_loop_applies_a_queued_change_keeps_it_queued(monkeypatch):
    model, s = _session()
    with s:
        _failing_build(monkeypatch, "bf16-true", KeyboardInterrupt())
        s.on_record(lambda r: r.step == 1 and s.update(precision="bf16-true"))
        with pytest.raises(KeyboardInterrupt):
            s.run(4)
        monkeypatch.undo()
        # nothing applied, the change still shown as queued (and not applied in passing)
        assert s.state == "paused" and s.step == 1
        assert s.config.precision == "fp32" and s.pending_changes == {"precision": "bf16-true"}
        s.update(lr=1e-3)  # applies what is queued, the queued change named with it
        assert s.config.precision == "bf16-true" and s.config.lr == 1e-3
        changes = [e.details["changes"] for e in s.events if e.kind == "change"]
        assert changes == [{"precision": "bf16-true", "lr": 1e-3}]


def _failing_rebuild(monkeypatch, session: Session, meanwhile: dict) -> None:
    """The next rebuild calls `session.update(**meanwhile)` (a change the user queues while
    it runs) and then fails; later ones build."""
    original = runtime.Runtime.rebuild
    calls = []

    def rebuild(self, target, changed, **kwargs):
        calls.append(changed)
        if len(calls) == 1:
            session.update(**meanwhile)  # the loop is running: queued, not applied
            raise RuntimeError("engine build failed (simulated)")
        return original(self, target, changed, **kwargs)

    monkeypatch.setattr(runtime.Runtime, "rebuild", rebuild)


def test_a_failed_build_keeps_a_change_queued_while_it_ran(monkeypatch):
    _, s = _session()
    with s:
        _failing_rebuild(monkeypatch, s, {"lr": 0.01})
        s.on_record(lambda r: r.step == 1 and s.update(precision="bf16-true"))
        records = s.run(4)
        assert s.config.precision == "fp32" and s.config.lr == 0.01
        assert s.pending_changes == {}
        [failed] = [e for e in s.events if e.kind == "change-failed"]
        assert failed.details["changes"] == {"precision": "bf16-true"}
        assert "still queued: {'lr': 0.01}" in failed.message
        assert [r.changes for r in records if r.changes] == [{"lr": 0.01}]


def test_a_change_that_needs_the_failed_one_is_dropped_and_named(monkeypatch):
    _, s = _session(grad_accum=2)
    with s:
        # optimizer_in_backward needs grad_accum=1: accepted on top of the failing change
        _failing_rebuild(monkeypatch, s, {"optimizer_in_backward": True})
        s.on_record(lambda r: r.step == 1 and s.update(grad_accum=1))
        s.run(3)
        assert s.config.grad_accum == 2 and s.config.optimizer_in_backward is False
        assert s.pending_changes == {}
        [failed] = [e for e in s.events if e.kind == "change-failed"]
        assert failed.details["dropped"] == {"optimizer_in_backward": True}
        assert "also dropped {'optimizer_in_backward': True}" in failed.message
        assert "grad_accum" in failed.message.split("also dropped", 1)[1]
