"""Faults: exceptions in model/data, non-finite loss, out of memory, failed changes."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from workbench import Session, TrainConfig
from workbench.train import runtime as runtime_module
from workbench.train.changes import ChangeQueue


def _wait_for(session: Session, condition, timeout: float = 60.0) -> None:
    """Poll `condition()` while the session trains; fail at once if the loop ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert session.state == "running", (session.state, session.events[-1:])
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


class Flaky(nn.Module):
    """A linear model that raises on chosen calls, or for batches larger than `oom_above`."""

    def __init__(self, *, fail_on_call: int | None = None, oom_above: int | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.calls = 0
        self.fail_on_call = fail_on_call
        self.oom_above = oom_above
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise ValueError("bad weights in layer 3")
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.inputs.append(x.detach().clone())
        return self.lin(x)


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


def test_exception_in_the_model_moves_to_error_and_resume_continues():
    model = Flaky(fail_on_call=3)
    with Session(
        TrainConfig(micro_batch=4), model=model, data=_data(), loss_fn=nn.functional.mse_loss
    ) as s:
        weights = None
        s.start(optimizer_steps=6)
        assert s.wait(timeout=60) == "error"
        assert s.step == 2
        weights = model.lin.weight.detach().clone()
        errors = [e for e in s.events if e.kind == "error"]
        assert len(errors) == 1 and errors[0].severity == "error"
        assert "ValueError: bad weights in layer 3" in errors[0].message
        assert "Traceback" in errors[0].details["traceback"]
        assert "bad weights" in errors[0].details["traceback"]
        assert all(p.grad is None for p in model.parameters())  # nothing half-applied
        assert torch.equal(model.lin.weight, weights)
        s.update(lr=1e-3)
        s.resume()
        assert s.wait(timeout=60) == "idle"
        assert s.step == 6  # the run's target
        assert s.history[2].changes == {"lr": 0.001}
        # the failed step's batch is skipped, not retried: 6 steps read 7 batches
        assert s.data_position.offset == 7 * 4
        assert "its batch is skipped" in errors[0].message


class BrokenData(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        if i == 5:
            raise IndexError("sample 5 is corrupt")
        return torch.ones(4) * i, torch.ones(1)


def test_exception_in_the_data_moves_to_error():
    with Session(
        TrainConfig(micro_batch=4),
        model=nn.Linear(4, 1),
        data=BrokenData(),
        loss_fn=nn.functional.mse_loss,
    ) as s:
        s.start(optimizer_steps=20)
        assert s.wait(timeout=60) == "error"
        assert "sample 5 is corrupt" in s.events[-1].message
        assert "__getitem__" in s.events[-1].details["traceback"]


def test_nan_loss_skips_the_step_pauses_and_advises(tiny):
    calls = {"n": 0}

    def loss_fn(out, y):
        calls["n"] += 1
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        return loss * float("nan") if calls["n"] == 3 else loss

    with Session(TrainConfig(micro_batch=2), model_options=tiny, loss_fn=loss_fn) as s:
        s.run(2)
        before = {k: v.clone() for k, v in s.model.state_dict().items()}
        opt_state = {
            k: v.clone()
            for k, v in s.backend.optimizer.state[next(iter(s.model.parameters()))].items()
        }
        recs = s.run(5)
        assert s.state == "paused"
        assert len(recs) == 1 and recs[0].skipped and math.isnan(recs[0].loss)
        ev = [e for e in s.events if e.kind == "nan-loss"][0]
        assert ev.step == recs[0].step == 3  # counted as the records count
        for hint in ("lower lr", "clip_grad_norm", "NaN/inf"):  # fp32: divergence advice
            assert hint in ev.message
        assert "amp-bf16" not in ev.message and "loss_scale_init" not in ev.message
        for k, v in s.model.state_dict().items():
            assert torch.equal(v, before[k]), k  # the step was not applied
        after = s.backend.optimizer.state[next(iter(s.model.parameters()))]
        assert all(torch.equal(after[k], v) for k, v in opt_state.items())
        assert all(p.grad is None for p in s.model.parameters())
        s.resume()
        assert s.wait(timeout=60) == "idle"
        assert s.step == 7 and all(math.isfinite(r.loss) for r in s.history[3:])


def test_out_of_memory_halves_micro_batch_and_retries_the_same_samples():
    model = Flaky(oom_above=2)
    reference = Flaky()
    data = _data()
    cfg = TrainConfig(micro_batch=8, grad_accum=1, seed=4, optimizer="sgd-nomomentum")
    with Session(cfg, model=model, data=data, loss_fn=nn.functional.mse_loss) as s:
        recs = s.run(2)
        assert s.config.micro_batch == 2 and s.config.grad_accum == 4
        ooms = [e for e in s.events if e.kind == "oom"]
        assert [e.details["micro_batch"] for e in ooms] == [4, 2]
        assert "micro_batch halved to 4 and grad_accum doubled to 2" in ooms[0].message
        assert "effective batch unchanged" in ooms[0].message
        assert "retrying the same batch" in ooms[0].message
        assert recs[0].changes == {"micro_batch": 2, "grad_accum": 4}
        assert recs[0].micro_batch * recs[0].grad_accum == 8
    # the same 16 samples, in the same order, as an unfailing run with micro_batch 8
    reference.load_state_dict(model.state_dict())
    with Session(cfg, model=reference, data=data, loss_fn=nn.functional.mse_loss) as r:
        r.run(2)
    assert torch.equal(torch.cat(model.inputs), torch.cat(reference.inputs))


class FlakyUpdated(Flaky):
    """Flaky, whose first out-of-memory call queues `changes` on `session` first (an
    `update()` made while the step ran)."""

    def __init__(self, changes: dict, **kw) -> None:
        super().__init__(**kw)
        self.changes: dict | None = changes
        self.session: Session | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.changes is not None and x.shape[0] > (self.oom_above or 0):
            changes, self.changes = self.changes, None
            self.session.update(**changes)
        return super().forward(x)


@pytest.mark.parametrize(
    ("changes", "shape", "said"),
    [
        # grad_accum alone: doubled with the retry's, the effective batch asked for (8 x 4)
        (
            {"grad_accum": 4},
            (4, 8),
            "your queued grad_accum=4 applies from the next step as "
            "micro_batch=4, grad_accum=8 (effective batch 32)",
        ),
        # a micro_batch below the one that ran out: as asked
        (
            {"micro_batch": 2},
            (2, 1),
            "your queued micro_batch=2 applies from the next step as "
            "micro_batch=2, grad_accum=1 (effective batch 2)",
        ),
        (
            {"micro_batch": 2, "grad_accum": 3},
            (2, 3),
            "your queued micro_batch=2, grad_accum=3 "
            "applies from the next step (effective batch 6)",
        ),
    ],
)
def test_a_batch_change_queued_at_an_out_of_memory_step_applies_after_it(changes, shape, said):
    model = FlakyUpdated(changes, oom_above=4)
    cfg = TrainConfig(micro_batch=8, grad_accum=1)
    with Session(cfg, model=model, data=_data(), loss_fn=nn.functional.mse_loss) as s:
        model.session = s
        recs = s.run(3)
        assert (s.config.micro_batch, s.config.grad_accum) == shape
        assert s.pending_changes == {}
        oom = next(e for e in s.events if e.kind == "oom")
        assert oom.message.endswith(said)
        assert (recs[0].micro_batch, recs[0].grad_accum) == (4, 2)  # the retried step
        assert (recs[1].micro_batch, recs[1].grad_accum) == shape
        assert "change-refused" not in [e.kind for e in s.events]


@pytest.mark.parametrize("changes", [{"micro_batch": 16}, {"micro_batch": 8, "grad_accum": 3}])
def test_a_micro_batch_queued_at_an_out_of_memory_step_that_would_run_out_too_is_refused(changes):
    model = FlakyUpdated(changes, oom_above=4)
    cfg = TrainConfig(micro_batch=8, grad_accum=1)
    with Session(cfg, model=model, data=_data(), loss_fn=nn.functional.mse_loss) as s:
        model.session = s
        s.run(3)
        assert (s.config.micro_batch, s.config.grad_accum) == (4, 2)  # the retry's
        assert s.pending_changes == {}
        (refused,) = [e for e in s.events if e.kind == "change-refused"]
        queued = ", ".join(f"{k}={v}" for k, v in changes.items())
        assert refused.message == (
            f"your queued {queued} was not applied: micro_batch={changes['micro_batch']} "
            "would run out of memory too: micro_batch=8 did; training goes on at "
            "micro_batch=4, grad_accum=2"
        )
        assert refused.details["changes"] == changes and refused.step == 1
        assert [e.kind for e in s.events].count("oom") == 1


def test_queued_changes_the_retry_cannot_take_are_refused_naming_why():
    ran_out = TrainConfig(micro_batch=8)
    retry = ran_out.replace(micro_batch=4, grad_accum=2)
    queue = ChangeQueue(ran_out, threading.RLock())
    queue.request({"grad_accum": 600_000}, lambda config, changed: [])  # doubled: over 10^6
    out = queue.after_oom(ran_out, retry)
    assert out.refused == {"grad_accum": 600_000} and out.why.startswith("grad_accum=1200000")
    assert queue.requested == retry and queue.pending() == {}
    queue = ChangeQueue(ran_out, threading.RLock())
    queue.request({"optimizer_in_backward": True, "lr": 0.1}, lambda config, changed: [])
    out = queue.after_oom(ran_out, retry)  # optimizer_in_backward needs grad_accum=1
    assert out.refused == {"optimizer_in_backward": True} and "needs grad_accum=1" in out.why
    assert queue.requested == retry.replace(lr=0.1) and queue.pending() == {"lr": 0.1}


def test_out_of_memory_at_micro_batch_one_is_an_error():
    model = Flaky(oom_above=0)
    with Session(
        TrainConfig(micro_batch=2), model=model, data=_data(), loss_fn=nn.functional.mse_loss
    ) as s:
        s.start(optimizer_steps=1)
        assert s.wait(timeout=60) == "error"
        assert "cannot halve micro_batch (micro_batch is 1)" in s.events[-1].message


def test_out_of_memory_under_optimizer_in_backward_says_it_cannot_halve():
    # grad_accum stays 1 under optimizer_in_backward: the halves could not be accumulated
    model = Flaky(oom_above=2)
    config = TrainConfig(micro_batch=4, optimizer_in_backward=True)
    with Session(config, model=model, data=_data(), loss_fn=nn.functional.mse_loss) as s:
        s.start(optimizer_steps=1)
        assert s.wait(timeout=60) == "error"
        message = s.events[-1].message
        assert "cannot halve micro_batch (optimizer_in_backward steps inside backward" in message
        assert "needs grad_accum=1" not in message
        assert s.config.micro_batch == 4 and s.config.grad_accum == 1


def test_a_change_that_fails_to_apply_is_rolled_back(monkeypatch, tiny):
    real = runtime_module.build_backend

    def failing(config, model, **kw):
        if config.optimizer == "sgd":
            raise RuntimeError("cannot allocate optimizer")
        return real(config, model, **kw)

    monkeypatch.setattr(runtime_module, "build_backend", failing)
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.run(1)
        backend = s.backend
        with pytest.raises(ValueError, match="cannot allocate optimizer"):
            s.update(optimizer="sgd", micro_batch=4)  # idle: applied now, fails, raises
        assert s.config.optimizer == "adamw" and s.config.micro_batch == 2
        assert s.backend is backend and s.pending_changes == {}
        ev = s.events[-1]
        assert ev.kind == "change-failed"
        assert ev.details["changes"] == {"optimizer": "sgd", "micro_batch": 4}
        # while running: rolled back, event, and training goes on
        s.start()
        s.update(optimizer="sgd")
        n = len(s.history)
        _wait_for(s, lambda: len(s.history) >= n + 3)
        s.stop()
        assert s.config.optimizer == "adamw"
        assert [e.kind for e in s.events].count("change-failed") == 2
        assert all(r.micro_batch == 2 and not r.changes for r in s.history)
        # a later valid change still works
        s.update(lr=1e-3)
        assert s.run(1)[0].changes == {"lr": 0.001}


def test_amp_fp16_overflow_steps_are_skipped_and_counted(tiny):
    cfg = TrainConfig(
        micro_batch=4, precision="amp-fp16", loss_scale_init=1e12, loss_scale_backoff=1e-3
    )
    with Session(cfg, model_options=tiny) as s:
        before = {k: v.clone() for k, v in s.model.state_dict().items()}
        first = s.run(1)[0]
        assert first.skipped and first.scale == pytest.approx(1e9)
        for k, v in s.model.state_dict().items():
            assert torch.equal(v, before[k]), k  # the overflowing step was not applied
        recs = s.run(6)
        assert s.state == "idle"  # overflow is not a fault: no pause
        skipped = [first, *recs]
        n_skipped = sum(r.skipped for r in skipped)
        assert 1 <= n_skipped < 7 and not skipped[-1].skipped
        assert s.backend.overflow_steps == n_skipped
        scales = [r.scale for r in skipped]
        assert scales[n_skipped - 1] < 65504  # backed off into fp16 range
        assert all(math.isfinite(r.loss) for r in skipped)


@pytest.mark.parametrize(
    ("precision", "present", "absent"),
    [
        # a NaN loss is a forward overflow the loss scale never reaches: not "lower it"
        ("amp-fp16", ("forward", "'amp-bf16'", "65504"), ("divergence", "lower loss_scale_init")),
        ("fp32", ("lower lr", "clip_grad_norm", "NaN/inf"), ("bf16", "loss_scale")),
        ("amp-bf16", ("divergence", "lower lr"), ("loss_scale", "'amp-bf16'")),
        ("bf16-true", ("divergence", "lower lr", "'amp-bf16' (fp32 weights"), ("loss_scale",)),
    ],
)
def test_nan_advice_fits_the_precision(precision, present, absent):
    from workbench.train.session import nan_advice

    text = nan_advice(TrainConfig(precision=precision, lr=3e-4))
    assert all(p in text for p in present), text
    assert not any(a in text for a in absent), text


def test_out_of_memory_under_zero_releases_the_old_engine_before_building_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both engines would not fit on a full GPU: the old one is exported to host memory and
    closed (and the allocator's cache emptied) before its successor is built."""
    from workbench.train.backends import deepspeed as zero

    order: list[str] = []
    real_init, real_close = zero.DeepSpeedBackend.__init__, zero.DeepSpeedBackend.close

    def init(self, *args, **kwargs):
        order.append("build")
        real_init(self, *args, **kwargs)

    def close(self):
        if not self._closed:
            order.append("close")
        real_close(self)

    real_release = runtime_module._release_device_memory
    monkeypatch.setattr(zero.DeepSpeedBackend, "__init__", init)
    monkeypatch.setattr(zero.DeepSpeedBackend, "close", close)
    monkeypatch.setattr(
        runtime_module,
        "_release_device_memory",
        lambda device: (order.append("release"), real_release(device))[1],
    )
    cfg = TrainConfig(micro_batch=8, zero_stage=2, seed=4)
    with Session(cfg, model=Flaky(oom_above=4), data=_data(), loss_fn=nn.functional.mse_loss) as s:
        recs = s.run(2)
        assert s.config.micro_batch == 4 and s.config.grad_accum == 2
        assert [e.kind for e in s.events].count("oom") == 1
        assert recs[0].warmup and not recs[1].warmup  # the first step on the new engine
        assert all(math.isfinite(r.loss) for r in recs)
    assert order[:4] == ["build", "close", "release", "build"], order
