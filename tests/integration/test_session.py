"""Session: the live loop, changes at step boundaries, threads, wrong-state calls."""

from __future__ import annotations

import math
import multiprocessing
import threading
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from workbench import Session, TrainConfig
from workbench.train.session import SessionError, SessionStateError
from workbench.train.techniques.recompute import mark_checkpointable


def _wait_for(session: Session, condition, timeout: float = 60.0) -> None:
    """Poll `condition()` while the session trains; fail at once if the loop ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert session.state == "running", (session.state, session.events[-1:])
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _grads_per_step(session: Session) -> list[dict[str, torch.Tensor]]:
    """Capture the gradients the backend is about to apply, at every step."""
    captured: list[dict[str, torch.Tensor]] = []
    backend = session.backend
    original = backend.step

    def spy(**read):  # the step hands over what it read (the gradient norm)
        captured.append({n: p.grad.detach().clone() for n, p in session.model.named_parameters()})
        return original(**read)

    backend.step = spy  # type: ignore[method-assign]
    return captured


@pytest.mark.parametrize("model", ["tiny-gpt", "mlp"])
def test_accumulation_4x8_gives_the_gradients_of_1x32(model, tiny):
    opts = dict(tiny, dropout=0.0) if model == "tiny-gpt" else {"hidden": 32, "depth": 2}
    grads = []
    for micro, accum in ((8, 4), (32, 1)):
        cfg = TrainConfig(micro_batch=micro, grad_accum=accum, optimizer="sgd-nomomentum", seed=3)
        with Session(cfg, model=model, model_options=opts) as s:
            captured = _grads_per_step(s)
            s.run(optimizer_steps=1)
            grads.append(captured[0])
    accum_grads, big_grads = grads
    assert accum_grads.keys() == big_grads.keys()
    for name in big_grads:
        torch.testing.assert_close(accum_grads[name], big_grads[name], rtol=1e-4, atol=1e-6)
    # and a different split of different data does not give the same gradients
    assert any(not torch.allclose(g, torch.zeros_like(g)) for g in big_grads.values())


def test_run_returns_records_with_fields_filled(tiny):
    with Session(TrainConfig(micro_batch=4), model_options=tiny, device="cpu") as s:
        recs = s.run(optimizer_steps=3)
    assert [r.step for r in recs] == [1, 2, 3]
    r = recs[-1]
    assert r.micro_batch == 4 and r.grad_accum == 1 and r.micro_steps == 1
    assert r.precision == "fp32" and r.zero_stage == 0 and not r.skipped
    assert math.isfinite(r.loss) and r.grad_norm is not None and r.grad_norm > 0
    assert r.tokens_per_s == pytest.approx(r.samples_per_s * tiny["seq_len"])
    assert r.step_seconds >= r.data_seconds >= 0
    assert r.compute_seconds == pytest.approx(r.step_seconds - r.data_seconds)
    assert r.params_bytes is not None and r.params_bytes > 0
    assert r.grads_bytes == r.params_bytes  # fp32 grads for every parameter
    assert r.optimizer_bytes is not None and r.optimizer_bytes >= 2 * r.params_bytes
    assert r.rss_bytes is not None and r.rss_bytes > 0
    assert r.cuda_allocated_bytes is None  # CPU run
    assert s.state == "closed"


def test_loss_goes_down_on_tiny_gpt(tiny):
    with Session(TrainConfig(micro_batch=16, lr=3e-3), model_options=tiny) as s:
        recs = s.run(optimizer_steps=30)
    first = sum(r.loss for r in recs[:5]) / 5
    last = sum(r.loss for r in recs[-5:]) / 5
    assert last < first - 0.3


def test_precision_switch_mid_run_shows_in_records_and_activation_dtype(tiny):
    seen: list[torch.dtype] = []
    with Session(TrainConfig(micro_batch=4), model_options=tiny) as s:
        s.model.blocks[0].mlp.fc.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        s.run(optimizer_steps=2)
        s.update(precision="amp-bf16")
        assert s.config.precision == "amp-bf16"  # idle: applied at once
        s.run(optimizer_steps=2)
        recs = s.history
    assert [r.precision for r in recs] == ["fp32", "fp32", "amp-bf16", "amp-bf16"]
    assert recs[2].changes == {"precision": "amp-bf16"}
    assert recs[3].changes == {}
    assert seen == [torch.float32, torch.float32, torch.bfloat16, torch.bfloat16]
    assert [e.kind for e in s.events] == ["change"]


def test_precision_switch_through_pure_bf16_and_back(tiny):
    """fp32 -> bf16-true -> amp-bf16 -> fp32: bf16 weights and activations without autocast
    in bf16-true; your module's hooks run on the engine's bf16 copy; fp32 again after."""
    seen: list[tuple[torch.dtype, torch.dtype, bool]] = []

    def hook(m, i, o):
        seen.append((m.weight.dtype, o.dtype, torch.is_autocast_enabled("cpu")))

    with Session(TrainConfig(micro_batch=4), model_options=tiny) as s:
        module = s.model
        module.blocks[0].mlp.fc.register_forward_hook(hook)
        s.run(optimizer_steps=1)
        for precision in ("bf16-true", "amp-bf16", "fp32"):
            s.update(precision=precision)
            assert (s.model is module) is (precision != "bf16-true")
            s.run(optimizer_steps=1)
        recs = s.history
    assert [r.precision for r in recs] == ["fp32", "bf16-true", "amp-bf16", "fp32"]
    assert all(math.isfinite(r.loss) for r in recs)
    f32, bf16 = torch.float32, torch.bfloat16
    assert seen == [(f32, f32, False), (bf16, bf16, False), (f32, bf16, True), (f32, f32, False)]
    assert recs[1].params_bytes == recs[0].params_bytes // 2  # bf16 weights: half of fp32
    assert all(p.dtype == f32 for p in module.parameters())


def test_update_while_running_applies_at_a_step_boundary(tiny):
    with Session(TrainConfig(micro_batch=4), model_options=tiny) as s:
        s.start()
        _wait_for(s, lambda: len(s.history) >= 2)
        s.update(micro_batch=2, grad_accum=3)
        _wait_for(s, lambda: any(r.micro_batch == 2 for r in s.records_since(0)))
        s.stop()
        recs = s.history
    changed = [r for r in recs if r.changes]
    assert len(changed) == 1
    first = changed[0]
    assert first.changes == {"micro_batch": 2, "grad_accum": 3}
    assert first.micro_batch == 2 and first.grad_accum == 3 and first.micro_steps == 3
    before = recs[: recs.index(first)]
    after = recs[recs.index(first) :]
    assert all(r.micro_batch == 4 and r.grad_accum == 1 for r in before)
    assert all(r.micro_batch == 2 and r.grad_accum == 3 for r in after)
    # the data stream continued where it was: every sample consumed exactly once
    consumed = sum(r.micro_batch * r.grad_accum for r in recs)
    assert s.data_position.offset == consumed


def test_micro_batch_switch_continues_the_same_sample_order(tiny):
    """Reading 4 then 2+2 samples gives the same samples as reading 8 at once."""
    seen: list[torch.Tensor] = []

    def record(m, args):
        seen.append(args[0].clone())

    cfg = TrainConfig(micro_batch=4, seed=5)
    with Session(cfg, model_options=tiny) as s:
        s.model.register_forward_pre_hook(record)
        s.run(1)
        s.update(micro_batch=2)
        s.run(2)
    switched = torch.cat(seen)
    seen.clear()
    with Session(cfg.replace(micro_batch=8), model_options=tiny) as s:
        s.model.register_forward_pre_hook(record)
        s.run(1)
    assert torch.equal(switched, seen[0])


def test_lr_scaling_and_warmup_follow_the_config(tiny):
    cfg = TrainConfig(micro_batch=4, lr=1e-3, lr_scaling="linear", warmup_steps=4, total_steps=100)
    with Session(cfg, model_options=tiny) as s:
        recs = s.run(4)
        assert [r.lr for r in recs] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
        s.update(grad_accum=2)  # effective batch 8 = 2x the starting 4
        assert s.run(1)[0].lr == pytest.approx(2e-3)
        s.update(lr_scaling="sqrt")
        assert s.run(1)[0].lr == pytest.approx(1e-3 * math.sqrt(2))
        s.update(lr_schedule="cosine", lr_scaling="none", warmup_steps=0, total_steps=10)
        lrs = [r.lr for r in s.run(3)]
    assert lrs[0] > lrs[1] > lrs[2]  # decaying: 6 of 10 steps done


def test_activation_checkpointing_toggles_live_and_keeps_the_trajectory(tiny):
    cfg = TrainConfig(micro_batch=4, seed=1)
    with Session(cfg, model_options=tiny) as plain:
        plain_losses = [r.loss for r in plain.run(4)]
    with Session(cfg, model_options=tiny) as s:
        losses = [r.loss for r in s.run(2)]
        without = s.memory().activation_bytes
        s.update(activation_checkpointing=True)
        with_ckpt = s.memory().activation_bytes
        recs = s.run(2)
        losses += [r.loss for r in recs]
    assert recs[0].activation_checkpointing and recs[0].changes == {
        "activation_checkpointing": "full"
    }
    assert with_ckpt < 0.6 * without
    # recomputation reproduces the dropout masks: same numbers as without checkpointing
    assert losses == pytest.approx(plain_losses, rel=1e-5)


def test_user_module_with_dataset_and_marked_blocks():
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x.sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    cfg = TrainConfig(micro_batch=8, lr=1e-2)
    with pytest.raises(ValueError, match="activation_checkpointing='full': the model has no"):
        Session(
            cfg.replace(activation_checkpointing=True),
            model=model,
            data=TensorDataset(x, y),
            loss_fn=nn.functional.mse_loss,
        )
    mark_checkpointable(model, ["0", "2"])
    with pytest.raises(ValueError, match=r"names=\['nope'\]"):
        mark_checkpointable(model, ["nope"])
    with Session(
        cfg.replace(activation_checkpointing=True),
        model=model,
        data=TensorDataset(x, y),
        loss_fn=nn.functional.mse_loss,
    ) as s:
        assert s.model is model
        recs = s.run(20)  # more than one epoch of 8 batches: the stream cycles
    assert recs[-1].loss < recs[0].loss
    assert recs[0].tokens_per_s is None


def test_user_dataloader_is_used_as_is_and_its_settings_cannot_change():
    x = torch.randn(32, 4)
    loader = DataLoader(TensorDataset(x, x.clone()), batch_size=4, shuffle=False)
    model = nn.Linear(4, 4)
    with Session(
        TrainConfig(micro_batch=8), model=model, data=loader, loss_fn=nn.functional.mse_loss
    ) as s:
        assert s.config.micro_batch == 4  # the loader's batch size
        s.run(10)  # 8 batches per epoch: cycles
        with pytest.raises(ValueError, match="micro_batch=2: data is a DataLoader you built"):
            s.update(micro_batch=2)
        with pytest.raises(ValueError, match="num_workers=1: data is a DataLoader you built"):
            s.update(num_workers=1)
        s.update(lr=1e-2)  # optimizer settings are fine
        assert s.run(1)[0].changes == {"lr": 0.01}
        assert s.config.micro_batch == 4


def test_bad_updates_raise_every_problem_and_leave_the_session_unchanged(tiny):
    with Session(TrainConfig(micro_batch=4), model_options=tiny, device="cpu") as s:
        s.start()
        before = s.config
        with pytest.raises(ValueError) as err:
            s.update(micro_batch=0, lr=-1.0, precision="fp8")
        text = str(err.value)
        assert "micro_batch=0" in text and "lr=-1.0" in text and "precision='fp8'" in text
        with pytest.raises(ValueError, match="bogus=1: unknown setting"):
            s.update(bogus=1)
        with pytest.raises(ValueError, match="loss_scale_growth=0.5: must be a finite number > 1"):
            s.update(precision="amp-fp16", loss_scale_growth=0.5)
        with pytest.raises(ValueError, match="device='cuda': this session runs on cpu"):
            s.update(device="cuda")
        with pytest.raises(ValueError, match="micro_batch='8'"):
            s.update(micro_batch="8")
        assert s.pending_changes == {}
        n = len(s.history)
        _wait_for(s, lambda: len(s.history) >= n + 2)
        assert s.state == "running"
        s.stop()
        assert s.config == before
        assert all(not r.changes for r in s.history)
        assert s.events == []


def test_wrong_state_calls_raise_and_change_nothing(tiny):
    s = Session(TrainConfig(micro_batch=2), model_options=tiny)
    with pytest.raises(SessionStateError, match="cannot pause: the session is idle"):
        s.pause()
    with pytest.raises(SessionStateError, match="cannot resume: the session is idle"):
        s.resume()
    with pytest.raises(ValueError, match="optimizer_steps=0"):
        s.run(0)
    assert s.state == "idle"
    s.start()
    with pytest.raises(SessionStateError, match="already running"):
        s.start()
    with pytest.raises(SessionStateError, match="already running"):
        s.run(1)
    s.pause()
    assert s.state == "paused"
    with pytest.raises(SessionStateError, match="cannot pause: the session is paused"):
        s.pause()
    step = s.step
    s.resume()
    s.stop()
    assert s.state == "stopped" and s.step >= step
    s.close()
    s.close()  # idempotent
    assert s.state == "closed"
    for call in (lambda: s.run(1), s.start, s.resume, s.pause, lambda: s.update(lr=0.1)):
        with pytest.raises(SessionStateError, match="closed"):
            call()


def test_run_pauses_when_paused_from_another_thread(tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        timer = threading.Timer(0.2, s.pause)
        timer.start()
        recs = s.run(optimizer_steps=100_000)
        timer.join()
        assert s.state == "paused"
        assert 0 < len(recs) < 100_000
        s.resume()
        s.pause()
        assert s.step > len(recs)


def test_start_with_steps_ends_idle_and_wait_returns(tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.start(optimizer_steps=5)
        assert s.wait(timeout=60) == "idle"
        assert s.step == 5
        assert [r.step for r in s.history] == [1, 2, 3, 4, 5]


def test_twenty_start_stop_cycles_leave_no_threads(no_leaked_threads, tiny):
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        for _ in range(20):
            s.start()
            assert s.state == "running"
            s.stop()
            assert s.state == "stopped"
        names = [t.name for t in threading.enumerate()]
        assert not any(n.startswith("workbench-session-") for n in names)
        assert s.step > 0


def test_loader_workers_are_rebuilt_and_shut_down(no_leaked_threads, tiny):
    with Session(TrainConfig(micro_batch=4, num_workers=1), model_options=tiny) as s:
        s.run(2)
        assert len(multiprocessing.active_children()) == 1
        s.update(num_workers=2)
        s.run(2)
        assert s.history[-2].num_workers == 2
        assert len(multiprocessing.active_children()) == 2
        s.update(num_workers=0)
        s.run(1)
        assert multiprocessing.active_children() == []
        s.update(num_workers=1)
        s.run(1)
    deadline = time.time() + 10
    while multiprocessing.active_children() and time.time() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []


def test_records_since_version_and_callbacks(tiny):
    got = []
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        remove = s.on_record(got.append)
        v0 = s.version
        s.run(3)
        assert s.version > v0
        assert [r.step for r in s.records_since(1)] == [2, 3]
        remove()
        s.run(1)
        s.on_record(lambda r: 1 / 0)
        s.run(1)
    assert [r.step for r in got] == [1, 2, 3]
    assert any(e.kind == "callback-error" for e in s.events)


def test_dataset_env_sharding_by_rank(monkeypatch, tiny):
    """WORLD_SIZE/RANK shard the data with DistributedSampler (no process group)."""
    from workbench.train.data import DataStream

    x = torch.arange(16).float().unsqueeze(1)
    ds = TensorDataset(x, x)
    parts = []
    for rank in (0, 1):
        stream = DataStream(ds, micro_batch=8, rank=rank, world_size=2, seed=0)
        parts.append(stream.next()[0].flatten())
        stream.close()
    assert sorted(torch.cat(parts).tolist()) == list(range(16))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match="RANK=5: must be < WORLD_SIZE=2"):
        Session(TrainConfig(), model_options=tiny)


def test_bad_constructor_arguments(tiny):
    with pytest.raises(ValueError, match="model='resnet'"):
        Session(TrainConfig(), model="resnet")
    with pytest.raises(ValueError, match="data=None: required with your own nn.Module"):
        Session(TrainConfig(), model=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="config="):
        Session({"lr": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"optimizer='lion': cannot train here.*'adamw'"):
        Session(TrainConfig(optimizer="lion", zero_stage=1), model_options=tiny)
    with pytest.raises(ValueError, match="unknown option"):
        Session(TrainConfig(), model_options={"width": 3})


def test_step_error_in_run_raises_session_error(tiny):
    calls = {"n": 0}

    def loss_fn(out, y):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyError("broken loss")
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    with Session(TrainConfig(micro_batch=2), model_options=tiny, loss_fn=loss_fn) as s:
        with pytest.raises(SessionError, match="broken loss"):
            s.run(3)
        assert s.state == "error" and s.step == 1
        assert s.run(2)[-1].step == 3


def test_a_keyboard_interrupt_pauses_and_says_why(tiny):
    def interrupt_at_step_2(record):
        if record.step == 2:
            raise KeyboardInterrupt

    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.on_record(interrupt_at_step_2)
        with pytest.raises(KeyboardInterrupt):
            s.run(4)
        assert s.state == "paused" and s.step == 2
        assert s.failure == (
            "training interrupted after step 2: KeyboardInterrupt; the session paused "
            "(resume() or run() goes on)"
        )
        assert s.events[-1].kind == "interrupted" and s.events[-1].message == s.failure
        s.run(1)  # a new run clears it
        assert s.failure is None and s.step == 3


def test_launch_needs_a_built_in_model():
    x = torch.randn(8, 2)
    with (
        Session(
            TrainConfig(micro_batch=2),
            model=nn.Linear(2, 2),
            data=TensorDataset(x, x),
            loss_fn=nn.functional.mse_loss,
        ) as s,
        pytest.raises(ValueError, match="multi-rank launch needs a built-in model name"),
    ):
        s.launch(ranks=2, steps=3)


def test_amp_fp16_with_zero_is_refused_up_front(tiny):
    with Session(TrainConfig(micro_batch=2, precision="amp-fp16"), model_options=tiny) as s:
        refused = "precision='amp-fp16': zero_stage=1 runs train through DeepSpeed: the workbench"
        with pytest.raises(ValueError, match=refused):
            s.update(zero_stage=1)
        assert s.config.zero_stage == 0 and s.events == []


def test_zero_stage_switch_on_a_live_session_and_back(tiny):
    """update(zero_stage=1) moves training into a DeepSpeed engine (gloo, one rank) with
    the weights and optimizer state; zero_stage=0 brings them back to the same module."""
    cfg = TrainConfig(micro_batch=4, seed=0)
    with Session(cfg, model_options=tiny) as reference:
        expected = [r.loss for r in reference.run(6)]
    with Session(cfg, model_options=tiny) as s:
        base = s.model
        losses = [r.loss for r in s.run(2)]
        s.update(zero_stage=1)
        assert type(s.backend).__name__ == "DeepSpeedBackend"
        recs = s.run(2)
        assert recs[0].changes == {"zero_stage": 1} and recs[0].zero_stage == 1
        s.update(zero_stage=0)
        assert type(s.backend).__name__ == "PlainBackend" and s.model is base
        recs += s.run(2)
        losses += [r.loss for r in recs]
    assert recs[2].changes == {"zero_stage": 0}
    # same data, same dropout masks: the trajectory continues (DeepSpeed's optimizer
    # rounds differently, hence not bit-exact)
    assert losses == pytest.approx(expected, rel=1e-3)


def test_a_new_session_on_the_same_module_closes_the_old_one(no_leaked_threads):
    x = torch.randn(16, 3)
    model = nn.Linear(3, 3)
    old = Session(
        TrainConfig(micro_batch=4),
        model=model,
        data=TensorDataset(x, x),
        loss_fn=nn.functional.mse_loss,
    )
    old.start()
    with pytest.warns(UserWarning, match="closing Session"):
        new = Session(
            TrainConfig(micro_batch=4),
            model=model,
            data=TensorDataset(x, x),
            loss_fn=nn.functional.mse_loss,
        )
    assert old.state == "closed" and new.state == "idle"
    new.run(2)
    new.close()


def test_clipping_reports_the_norm_before_clipping(tiny):
    cfg = TrainConfig(
        micro_batch=4, clip_grad_norm=1e-3, optimizer="sgd-nomomentum", lr=1.0, weight_decay=0.0
    )
    with Session(cfg, model_options=tiny) as s:
        before = {n: p.detach().clone() for n, p in s.model.named_parameters()}
        rec = s.run(1)[0]
        moved = torch.sqrt(
            sum(((p.detach() - before[n]) ** 2).sum() for n, p in s.model.named_parameters())
        )
    assert rec.grad_norm is not None and rec.grad_norm > 1e-3
    assert rec.clip_grad_norm == 1e-3
    # plain SGD with lr 1 and no weight decay: the update is the clipped gradient
    assert float(moved) == pytest.approx(1e-3, rel=0.05)


def test_deepspeed_fp16_on_a_cpu_without_fp16_is_refused_up_front(monkeypatch, tiny):
    """DeepSpeed's CPU accelerator has fp16 only with oneDNN fp16 support; without it
    the change is refused by update() itself, not later when the engine is built."""
    from workbench.train import changes

    monkeypatch.setattr(changes, "_deepspeed_fp16_on_cpu", lambda: False)
    with Session(TrainConfig(micro_batch=2), model_options=tiny, device="cpu") as s:
        s.start()
        with pytest.raises(ValueError, match="precision='fp16': DeepSpeed's fp16 does not run"):
            s.update(precision="fp16")
        assert s.pending_changes == {} and s.state == "running"
        s.stop()
        assert s.config.precision == "fp32" and s.events == []
    with pytest.raises(ValueError, match="precision='fp16'"):
        Session(TrainConfig(precision="fp16"), model_options=tiny, device="cpu")


def test_precision_switch_on_a_running_thread_changes_the_activation_dtype_at_that_step(tiny):
    """update() from another thread while the loop runs: the record that carries the
    change is the first whose forward ran in bf16."""
    dtypes: list[torch.dtype] = []
    with Session(TrainConfig(micro_batch=2), model_options=tiny) as s:
        s.model.blocks[0].mlp.fc.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
        s.start()
        _wait_for(s, lambda: len(s.history) >= 2)
        s.update(precision="amp-bf16")
        _wait_for(s, lambda: any(r.precision == "amp-bf16" for r in s.records_since(0)))
        s.stop()
        recs = s.history
    assert len(dtypes) == len(recs)  # one forward per step (grad_accum 1)
    changed = [i for i, r in enumerate(recs) if r.changes]
    assert len(changed) == 1 and recs[changed[0]].changes == {"precision": "amp-bf16"}
    k = changed[0]
    assert k >= 2
    assert [r.precision for r in recs] == ["fp32"] * k + ["amp-bf16"] * (len(recs) - k)
    assert dtypes == [torch.float32] * k + [torch.bfloat16] * (len(recs) - k)


@pytest.mark.cpu_only
def test_cuda_is_refused_where_there_is_none(tiny):
    with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
        Session(TrainConfig(), model_options=tiny, device="cuda")
