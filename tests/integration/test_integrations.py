"""Observing runs the workbench does not own: a real Hugging Face `Trainer`, a real Lightning
`Trainer` and a hand-written loop, each recorded as StepRecords whose losses equal the
trainer's own, next to the prediction for the trainer's settings, with advice naming the
trainer's argument, and shown by `workbench.dashboard(observer)`."""

from __future__ import annotations

import math

import pytest
import torch

import workbench
from workbench.integrations import Observer, observe

VOCAB = 128


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = 48, seq: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, VOCAB, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def _hf_run(tmp_path, **args):  # type: ignore[no-untyped-def]
    from transformers import Trainer, TrainingArguments

    from workbench.integrations import WorkbenchTrainerCallback

    settings = {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "max_steps": 5,
        "logging_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "use_cpu": True,
        "disable_tqdm": True,
        **args,
    }
    callback = WorkbenchTrainerCallback()
    trainer = Trainer(
        model=_gpt2(),
        args=TrainingArguments(output_dir=str(tmp_path / "out"), **settings),
        train_dataset=Tokens(),
        callbacks=[callback],
    )
    trainer.train()
    assert callback.observer is not None
    return trainer, callback.observer


def test_a_transformers_trainer_run_is_recorded_with_its_own_losses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trainer, obs = _hf_run(tmp_path)
    records = obs.records()
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert [r.step for r in records] == [1, 2, 3, 4, 5]
    # the step's loss is the Trainer's (it normalises each micro-batch by the step's tokens)
    assert [r.loss for r in records] == pytest.approx([e["loss"] for e in logged], rel=1e-4)
    assert [r.grad_norm for r in records] == pytest.approx([e["grad_norm"] for e in logged])
    assert [r.lr for r in records] == pytest.approx([e["learning_rate"] for e in logged])
    assert all(r.micro_steps == 2 and r.micro_batch == 4 and r.grad_accum == 2 for r in records)
    # 4 x 2 samples of 32 tokens each step
    last = records[-1]
    assert last.tokens_per_s == pytest.approx(last.samples_per_s * 32)
    assert last.samples_per_s == pytest.approx(8 / last.step_seconds)
    assert 0 <= last.data_seconds <= last.step_seconds
    assert last.rss_bytes and last.rss_bytes > 0
    # measured model states next to the prediction for the Trainer's own settings
    predicted = obs.predict()
    assert last.params_bytes == predicted.params_bytes
    assert last.grads_bytes == predicted.grads_bytes
    assert predicted.activation_bytes is not None  # the GPT-2 shape at the batches' length
    assert obs.read_from["gradient_accumulation_steps"] == 2
    assert obs.config.clip_grad_norm == 1.0  # max_grad_norm's default


def test_trainer_arguments_map_onto_the_workbench_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import TrainingArguments

    from workbench.integrations.hf import settings_from_args

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        gradient_accumulation_steps=4,
        bf16=True,
        use_cpu=True,
        gradient_checkpointing=True,
        dataloader_num_workers=2,
        max_grad_norm=0.0,
        optim="adamw_torch",
        report_to=[],
    )
    settings, read, notes = settings_from_args(args)
    config = workbench.TrainConfig(**settings)
    assert (config.micro_batch, config.grad_accum, str(config.precision)) == (16, 4, "amp-bf16")
    assert config.activation_checkpointing and config.num_workers == 2
    assert config.clip_grad_norm is None and str(config.optimizer) == "adamw"
    assert read["bf16"] is True and notes == []
    ds = {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
    }
    from workbench.integrations.hf import _from_deepspeed

    out = _from_deepspeed(ds, settings, notes)
    assert out["zero_stage"] == 3 and str(out["offload_optimizer"]) == "cpu"


def test_the_advice_names_the_trainers_argument_and_applies_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, obs = _hf_run(tmp_path, max_steps=2)
    advice = obs.advice()
    memory = [a for a in advice if a.id == "memory-technique"]
    assert memory, [a.message for a in advice]
    (a,) = memory
    assert a.apply is None
    # an fp32 run of a few MiB with GiBs to spare: not pure bf16 (no fp32 master copy),
    # which is offered only where memory is short
    assert a.evidence["workbench_change"] != {"precision": "bf16-true"}
    assert "pure bf16" in a.evidence["not_offered"]["pure bf16 (precision='bf16-true')"]
    assert f"→ in your TrainingArguments: {obs.say(a.evidence['workbench_change'])}" in a.message
    # where it is offered, the model's dtype is from_pretrained's argument, not the Trainer's
    text = obs.say({"precision": "bf16-true"})
    assert text.startswith("bf16=False, and the model loaded in bf16: from_pretrained(")
    assert "dtype=torch.bfloat16" in text and "torch_dtype= before transformers 4.56" in text


def test_a_lightning_trainer_run_is_recorded_with_its_own_losses() -> None:
    from workbench.integrations import WorkbenchLightningCallback

    callback = WorkbenchLightningCallback(grad_norm=True)
    module = _lightning_fit(
        callback,
        max_steps=4,
        limit_train_batches=None,
        accumulate_grad_batches=2,
        precision="bf16-mixed",
        gradient_clip_val=1.0,
    )
    obs = callback.observer
    assert obs is not None
    records = obs.records()
    assert [r.step for r in records] == [1, 2, 3, 4]
    expected = [sum(module.losses[i : i + 2]) / 2 for i in range(0, 8, 2)]
    assert [r.loss for r in records] == pytest.approx(expected, rel=1e-2)  # bf16 rounding
    assert str(obs.config.precision) == "amp-bf16" and obs.config.grad_accum == 2
    assert obs.config.micro_batch == 4 and obs.config.lr == 1e-3
    assert all(r.grad_norm is not None and math.isfinite(r.grad_norm) for r in records)
    assert records[-1].params_bytes == obs.predict().params_bytes
    advice = obs.advice()
    assert all(a.apply is None for a in advice)
    text = obs.say({"grad_accum": 8, "precision": "bf16-true"})
    assert text == (
        "Trainer(accumulate_grad_batches=...): accumulate_grad_batches=8, "
        'Trainer(precision="bf16-true")'
    )


def test_a_hand_written_loop_is_observed() -> None:
    from workbench.models import build_model

    model, data, loss_fn, _ = build_model("tiny-gpt", layers=2, hidden=64, heads=4, seq_len=32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    losses = []
    with observe(model, optimizer, micro_batch=4, grad_norm=True) as obs:
        for i, (x, y) in enumerate(loader):
            obs.begin_step()
            loss = loss_fn(model(x), y)
            loss.backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            optimizer.step()
            obs.step(loss, batch=x)
            optimizer.zero_grad()
            losses.append((float(loss), float(norm)))
            if i == 3:
                break
    records = obs.records()
    assert [r.loss for r in records] == pytest.approx([a for a, _ in losses])
    assert [r.grad_norm for r in records] == pytest.approx([b for _, b in losses], rel=1e-5)
    assert records[-1].tokens_per_s == pytest.approx(records[-1].samples_per_s * 32)
    assert obs.state == "closed"
    with pytest.raises(RuntimeError, match="closed"):
        obs.step(1.0)
    assert "(the workbench's name)" in obs.say({"grad_accum": 4})


def test_bad_observer_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="model=3: must be a torch.nn.Module"):
        Observer(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="optimizer='sgd': must be a torch.optim.Optimizer"):
        Observer(torch.nn.Linear(2, 2), "sgd")  # type: ignore[arg-type]
    for bad in ("yes", 0, -2, 1.5, None):
        with pytest.raises(
            ValueError,
            match=rf"grad_norm={bad!r}: must be True \(every step\), False \(never\), an int "
            r"k >= 1 \(every k-th step\) or 'auto'",
        ):
            Observer(torch.nn.Linear(2, 2), grad_norm=bad)  # type: ignore[arg-type]


def _loop(grad_norm: object, steps: int, pause: float = 0.0, slow_norm: float = 0.0):  # type: ignore[no-untyped-def]
    """A hand-written SGD loop of `steps` steps observed with `grad_norm`; `pause` seconds
    of extra work in each step, `slow_norm` seconds added to each norm the observer takes.
    Returns the observer and the true norms."""
    import time

    from workbench.integrations import observer as observer_module

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    norm = observer_module._total_norm

    def timed_norm(grads, one_kind):  # type: ignore[no-untyped-def]
        if slow_norm:
            time.sleep(slow_norm)
        return norm(grads, one_kind)

    true = []
    g = torch.Generator().manual_seed(0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(observer_module, "_total_norm", timed_norm)
        with observe(model, optimizer, micro_batch=4, grad_norm=grad_norm) as obs:
            for _ in range(steps):
                loss = model(torch.randn(4, 8, generator=g)).square().mean()
                loss.backward()
                true.append(
                    float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
                )
                time.sleep(pause)
                optimizer.step()
                obs.step(loss)
                optimizer.zero_grad()
    return obs, true


def test_grad_norm_every_k_steps_takes_the_first_and_each_kth() -> None:
    obs, true = _loop(3, 7)
    norms = [r.grad_norm for r in obs.records()]
    taken = [i + 1 for i, n in enumerate(norms) if n is not None]
    assert taken == [1, 3, 6]
    assert [norms[i - 1] for i in taken] == pytest.approx([true[i - 1] for i in taken], rel=1e-5)
    obs, _ = _loop(False, 3)
    assert [r.grad_norm for r in obs.records()] == [None, None, None]


def test_grad_norm_auto_spaces_a_costly_norm_out_and_keeps_a_cheap_one_every_step() -> None:
    """With "auto", a norm that costs far over the 0.1% budget of its step is taken at most
    every 10th step, a norm far under it every step (a 4-tensor norm takes 0.1-0.25 ms here,
    a quarter of the budget of a 1 s step or less)."""
    from workbench.integrations.observer import NORM_BUDGET, norm_interval

    obs, _ = _loop("auto", 6, pause=0.002, slow_norm=0.02)
    norms = [r.grad_norm for r in obs.records()]
    assert norms[0] is not None and norms[1] is not None  # the first two measure the cost
    assert norms[2:] == [None] * 4
    assert obs.norm_every >= 10
    obs, true = _loop("auto", 4, pause=1.0)
    assert obs.norm_every == 1
    assert [r.grad_norm for r in obs.records()] == pytest.approx(true, rel=1e-5)
    # the rule itself
    assert norm_interval(NORM_BUDGET * 0.1, 0.1) == 1
    assert NORM_BUDGET == 0.001
    assert norm_interval(50e-6, 3.7e-3) == 14  # 50 us of a 3.7 ms step: 1.35%, every 14th
    assert norm_interval(1.0, 0.0) == 1 and norm_interval(10.0, 1e-3) == 1000


def test_the_dashboard_of_an_observed_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, obs = _hf_run(tmp_path, max_steps=3)
    d = workbench.dashboard(obs)
    try:
        d.training.refresh(draw_now=True)
        assert d.training.chart_data()["loss"] == pytest.approx([r.loss for r in obs.records()])
        bars = d.training.memory_chart_data()
        assert bars["labels"][:2] == ["parameters", "gradients"]
        assert bars["measured"][0] == pytest.approx(bars["predicted"][0])
        assert "gradient_accumulation_steps" in d.training.settings_html.value
        assert "observing your TrainingArguments" in d.training.status.value
        assert d.tabs.titles == ("Observed run", "Hardware monitor", "Memory estimator")
        assert d.estimator.read_inputs()[0]["micro_batch"] == 4  # the estimator opens on the run
        assert d.snapshot_png()[:4] == b"\x89PNG"
    finally:
        d.close()


def test_a_dashboard_shown_before_training_takes_the_run_into_its_estimator_tab(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    """As the README and notebook 06 show it: the dashboard displayed before
    `trainer.train()` opens on the panel's defaults (no model handed over yet), and the
    first refresh after the Trainer attaches its model puts the run into the tab: its
    micro-batch, shape and parameter count, not the 7B default."""
    from transformers import Trainer, TrainingArguments

    from workbench.integrations import WorkbenchTrainerCallback

    callback = WorkbenchTrainerCallback()
    trainer = Trainer(
        model=_gpt2(),
        args=TrainingArguments(
            output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2,
            report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        ),
        train_dataset=Tokens(),
        callbacks=[callback],
    )  # fmt: skip
    d = workbench.dashboard(callback.observer)
    try:
        default = d.estimator.estimate
        assert default is not None and default.n_params > 10**9  # the panel's 7B
        assert not d.sync_estimator()  # nothing attached yet: nothing to put in
        trainer.train()
        d.training.refresh(draw_now=True)
        inputs = d.estimator.read_inputs()[0]
        model = trainer.model
        assert inputs["micro_batch"] == 4
        assert inputs["hidden"] == model.config.n_embd and inputs["layers"] == model.config.n_layer
        n = sum(p.numel() for p in model.parameters())
        assert d.estimator.estimate is not None
        assert d.estimator.estimate.n_params == pytest.approx(n, rel=0.05)
        assert not d.sync_estimator()  # the same run again: the tab is left as it is
    finally:
        d.close()


def test_a_loss_scale_is_read_with_the_loss() -> None:
    """fp16's GradScaler (on CPU too): the record's scale is the scaler's, read from its
    tensor in the step's one read."""
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    with observe(model, optimizer, micro_batch=4) as obs:
        for _ in range(3):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            obs.step(loss, scale=scaler._scale)
            optimizer.zero_grad()
            assert obs.records()[-1].scale == scaler.get_scale()
    assert [r.scale for r in obs.records()] == [2048.0, 4096.0, 8192.0]


def _leaves(value):  # type: ignore[no-untyped-def]
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_a_callbacks_steps_are_read_from_the_device_in_batches() -> None:
    """`end_step` (what the trainer callbacks call) copies each step's device values into
    the observer's own slots: one host read makes the records of FLUSH_EVERY steps, and a
    read of the records makes the rest. No tensor of the trainer's is kept: a loss scale
    updated in place after its step is recorded as it was at that step. (A CPU run's
    values are read at once instead: `test_a_cpu_runs_values_are_read_at_once`.)"""
    import weakref

    from workbench.integrations import observer as observer_module
    from workbench.integrations import step_values

    model = torch.nn.Linear(4, 1)
    obs = Observer(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_norm=False)
    obs._slots_on_cpu = True  # the path a CUDA run's values take (a CPU's are read at once)
    reads = []
    read = step_values.StepSlots.read

    def counted(self):  # type: ignore[no-untyped-def]
        reads.append(1)
        return read(self)

    steps = observer_module.FLUSH_EVERY + 5
    losses = [float(i) for i in range(steps)]
    scale = torch.tensor(1.0)  # as a GradScaler's `_scale`: one tensor, changed in place
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_values.StepSlots, "read", counted)
        kept = []
        for value in losses:
            loss = torch.tensor(value, requires_grad=True) * 1.0
            kept.append(weakref.ref(loss))
            obs.end_step(loss, scale=scale)
            scale.mul_(2.0) if value < 10 else scale.fill_(1.0)
            del loss
        assert all(ref() is None for ref in kept)  # the trainer's tensors are not held
        # (nor a view of them)
        assert not [v for e in obs._pending for v in _leaves(e) if isinstance(v, torch.Tensor)]
        assert len(reads) == 1
        records = obs.records()
        assert len(reads) == 2
    assert [r.loss for r in records] == losses
    assert [r.step for r in records] == list(range(1, steps + 1))
    assert [r.scale for r in records[:12]] == [2.0**i for i in range(11)] + [1.0]
    obs.close()
    with pytest.raises(RuntimeError, match="closed"):
        obs.end_step(1.0)


def test_a_loss_the_slots_cannot_take_is_kept_as_its_number() -> None:
    """A loss of a tensor subclass (a tensor-parallel run's DTensor) is read as a number at
    once instead of copied into the observer's slots, and the run goes on."""

    class Wrapped(torch.Tensor):
        pass

    model = torch.nn.Linear(4, 1)
    obs = Observer(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_norm=False)
    for value in (3.0, 5.0):
        obs.end_step(torch.tensor(value).as_subclass(Wrapped), scale=torch.tensor([8.0]))
    assert [(r.loss, r.scale) for r in obs.records()] == [(3.0, 8.0), (5.0, 8.0)]


def test_a_cpu_runs_values_are_read_at_once() -> None:
    """On a CPU a step's loss and loss scale are ready when the op returns: the observer
    reads them at once (no slots made, no tensor of the trainer's kept), each step's as it
    was then, and a per-sample loss counts as its mean."""
    import weakref

    model = torch.nn.Linear(4, 1)
    obs = Observer(model, torch.optim.SGD(model.parameters(), lr=0.1), grad_norm=False)
    scale = torch.tensor(1.0)
    kept = []
    for value in (1.0, 2.0, 3.0):
        loss = torch.tensor(value, requires_grad=True) * 1.0
        kept.append(weakref.ref(loss))
        obs.end_step(loss, scale=scale)
        scale.mul_(2.0)
        del loss
    obs.end_step(torch.tensor([1.0, 3.0]))  # a per-sample loss
    assert all(ref() is None for ref in kept)
    assert obs._slots is None
    assert not [v for e in obs._pending for v in _leaves(e) if isinstance(v, torch.Tensor)]
    records = obs.records()
    assert [r.loss for r in records] == [1.0, 2.0, 3.0, 2.0]
    assert [r.scale for r in records] == [1.0, 2.0, 4.0, None]


def _lightning_fit(callback, *, manual: bool = False, extra=(), **trainer_args):  # type: ignore[no-untyped-def]
    """A tiny-gpt LightningModule trained on the CPU with `callback` (and the `extra`
    callbacks, the Trainer's arguments `trainer_args` over one epoch of 8 batches of 4);
    returns the module, whose `losses` are training_step's and `norms` the gradients'
    total norm in its own `on_before_optimizer_step` (before Lightning clips), one per
    optimizer step. `manual`: it optimizes by hand, stepping every second batch with
    each batch's loss halved."""
    import lightning as L

    from workbench.models import build_model

    model, data, loss_fn, _ = build_model("tiny-gpt", layers=2, hidden=64, heads=4, seq_len=32)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.automatic_optimization = not manual
            self.losses: list[float] = []
            self.norms: list[float] = []

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = loss_fn(self.model(x), y)
            if manual:
                loss = loss / 2
                self.manual_backward(loss)
                if i % 2 == 1:
                    opt = self.optimizers()
                    opt.step()
                    opt.zero_grad()
            self.losses.append(loss.detach().item())
            return loss

        def on_before_optimizer_step(self, optimizer):  # type: ignore[no-untyped-def]
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            self.norms.append(float(torch.nn.utils.get_total_norm(grads)))

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-3, weight_decay=0.0)

    settings = {
        "max_epochs": 1,
        "limit_train_batches": 8,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **trainer_args,
    }
    module = Module()
    trainer = L.Trainer(callbacks=[callback, *extra], **settings)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return module


def test_lightning_calls_the_optimizer_hook_only_on_the_steps_that_read_gradients() -> None:
    """Without accumulation every batch is an optimizer step: Lightning is left to call
    `on_before_optimizer_step` only on the steps that take the norm (every 3rd here) or
    count the states (steps 1 and 2), and skips the hooks the callback has no use for;
    the records still hold every step's loss and the norm of the steps that took it."""
    from workbench.integrations import WorkbenchLightningCallback

    called = []
    hook = WorkbenchLightningCallback.on_before_optimizer_step

    def counted(self, trainer, pl_module, optimizer):  # type: ignore[no-untyped-def]
        called.append(trainer.global_step + 1)
        hook(self, trainer, pl_module, optimizer)

    callback = WorkbenchLightningCallback(grad_norm=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WorkbenchLightningCallback, "on_before_optimizer_step", counted)
        module = _lightning_fit(callback, max_steps=7)
    assert called == [1, 2, 3, 6]
    records = callback.observer.records()
    assert [r.loss for r in records] == pytest.approx(module.losses, rel=1e-6)
    taken = {r.step: r.grad_norm for r in records if r.grad_norm is not None}
    assert sorted(taken) == [1, 3, 6]
    assert [taken[s] for s in (1, 3, 6)] == pytest.approx(
        [module.norms[s - 1] for s in (1, 3, 6)], rel=1e-5
    )
    assert records[0].params_bytes and records[1].optimizer_bytes
    for name in ("on_before_backward", "on_after_backward", "on_before_zero_grad"):
        assert getattr(callback, name) is None  # Lightning skips them


def test_lightning_accumulation_changed_by_a_scheduler_is_followed() -> None:
    """A GradientAccumulationScheduler moves `accumulate_grad_batches` from 1 to 2 at the
    second epoch: the records follow it, one per optimizer step, each with the mean of
    its micro-batches' losses."""
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    from workbench.integrations import WorkbenchLightningCallback

    callback = WorkbenchLightningCallback(grad_norm=True)
    module = _lightning_fit(
        callback, max_epochs=2, extra=[GradientAccumulationScheduler(scheduling={0: 1, 1: 2})]
    )
    records = callback.observer.records()
    per_epoch = len(module.losses) // 2
    first = module.losses[:per_epoch]
    second = module.losses[per_epoch:]
    expected = first + [sum(second[i : i + 2]) / 2 for i in range(0, per_epoch, 2)]
    assert len(records) == len(module.norms) == per_epoch + per_epoch // 2
    assert [r.loss for r in records] == pytest.approx(expected, rel=1e-6)
    assert [r.grad_norm for r in records] == pytest.approx(module.norms, rel=1e-5)
    assert [r.micro_steps for r in records] == [1] * per_epoch + [2] * (per_epoch // 2)


def test_lightning_manual_optimization_is_recorded_per_optimizer_step() -> None:
    """A module that optimizes by hand and steps every second batch: one record per
    optimizer step it took, with the sum of its two batches' (halved) losses."""
    from workbench.integrations import WorkbenchLightningCallback

    callback = WorkbenchLightningCallback(grad_norm=False)
    module = _lightning_fit(callback, manual=True)
    records = callback.observer.records()
    expected = [module.losses[i] + module.losses[i + 1] for i in range(0, 8, 2)]
    assert [r.loss for r in records] == pytest.approx(expected, rel=1e-6)
