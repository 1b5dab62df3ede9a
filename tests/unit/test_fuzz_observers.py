"""Observers that cannot read a loss: the record's loss is None ("unknown", not NaN), the
observer says once why and how to expose it, the dashboard shows "loss unknown", and the
advisor says nothing about a loss it was never shown. A loss that is really not finite
(a diverging run) stays NaN and is still advised. The trainers' hooks are driven by hand
with small fakes (tests/integration/test_hostile_observers.py runs the real trainers)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from workbench.advisor import advise
from workbench.integrations import Observer, observe


class Tiny(torch.nn.Module):
    """A model whose output has no `.loss` (the loss is computed outside it)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.emb(input_ids)}


def _steps(obs: Observer, losses: list[float | None]) -> None:
    for loss in losses:
        obs.begin_step()
        obs.end_step(loss)


def test_a_step_without_a_loss_is_recorded_as_unknown_and_advised_nothing() -> None:
    obs = Observer(None, trainer="transformers")
    obs.attach(Tiny())
    _steps(obs, [None] * 6)
    records = obs.records()
    assert [r.loss for r in records] == [None] * 6
    ids = [a.id for a in obs.advice()]
    assert "nonfinite-loss" not in ids
    assert not any("diverg" in a.message for a in obs.advice())


def test_an_unknown_loss_survives_the_log_and_reads_as_unknown() -> None:
    """A record of an observed run written to a log (`to_dict`) and read back
    (`from_dict`, as a resumed run or `read_records` does) keeps its unknown loss."""
    from workbench.train.records import StepRecord

    obs = Observer(None, trainer="transformers")
    obs.attach(Tiny())
    _steps(obs, [None])
    record = obs.records()[0]
    again = StepRecord.from_dict(record.to_dict())
    assert again.loss is None and again == record
    assert dict(again._display().rows)["loss"] == "unknown"


def test_the_missing_loss_is_said_once_with_why() -> None:
    obs = Observer(None, trainer="lightning", no_loss_note="return the loss from training_step")
    obs.attach(Tiny())
    _steps(obs, [None] * 3)
    obs.records()
    _steps(obs, [None] * 2)
    obs.records()
    said = [n for n in obs.notes if "loss unknown" in n]
    assert len(said) == 1 and "return the loss from training_step" in said[0]
    events = [e for e in obs.events if e.kind == "loss-unknown"]
    assert len(events) == 1 and events[0].step == 1 and events[0].severity == "warning"


def test_a_really_nonfinite_loss_stays_nan_and_is_advised() -> None:
    obs = Observer(None)
    obs.attach(Tiny())
    _steps(obs, [1.0, float("nan"), None])
    records = obs.records()
    assert records[0].loss == 1.0
    assert math.isnan(records[1].loss)
    assert records[2].loss is None
    critical = [a for a in obs.advice() if a.id == "nonfinite-loss"]
    assert len(critical) == 1 and critical[0].evidence["steps"] == [2]
    assert not [e for e in obs.events if e.kind == "loss-unknown" and e.step != 3]


def test_a_hand_written_loop_without_a_loss_says_to_pass_it() -> None:
    model = Tiny()
    with observe(model, torch.optim.SGD(model.parameters(), lr=0.1)) as obs:
        record = obs.step()
    assert record.loss is None
    assert any("obs.step(loss)" in n for n in obs.notes)


def test_the_advisor_reads_none_losses_without_a_rule_firing() -> None:
    base = {
        "samples_per_s": 10.0, "step_seconds": 0.1, "data_seconds": 0.0, "lr": 1e-3,
        "grad_norm": 1.0, "scale": None, "skipped": False, "precision": "fp32",
        "micro_batch": 4, "grad_accum": 1,
    }  # fmt: skip
    records = [{**base, "step": i, "loss": None} for i in range(1, 60)]
    assert advise(records) == []


def _hf_callback(logging_steps: int):  # type: ignore[no-untyped-def]
    from workbench.integrations import WorkbenchTrainerCallback

    cb = WorkbenchTrainerCallback(grad_norm=False)
    model = Tiny().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args = SimpleNamespace(
        per_device_train_batch_size=2, gradient_accumulation_steps=2, logging_steps=logging_steps,
        logging_strategy="steps", max_grad_norm=0.0,
    )  # fmt: skip
    cb.on_train_begin(args, None, None, model=model, optimizer=opt)
    return cb, model, opt, args


def _hf_step(cb, model, opt, args, logged: float | None = None) -> None:  # type: ignore[no-untyped-def]
    ids = torch.zeros(2, 4, dtype=torch.long)
    cb.on_step_begin(args, None, None)
    for _ in range(2):  # two micro-batches; the loss computed outside the model
        model(input_ids=ids)["logits"].sum().backward()
    cb.on_pre_optimizer_step(args, None, None, optimizer=opt)
    cb.on_step_end(args, None, None, optimizer=opt)
    if logged is not None:
        cb.on_log(args, None, None, logs={"loss": logged, "learning_rate": 0.1})


def test_an_hf_trainer_whose_loss_is_outside_the_model_records_unknown() -> None:
    cb, model, opt, args = _hf_callback(logging_steps=500)
    for _ in range(3):
        _hf_step(cb, model, opt, args)
    records = cb.observer.records()
    assert [r.loss for r in records] == [None] * 3
    assert [r.micro_steps for r in records] == [2] * 3
    assert "nonfinite-loss" not in [a.id for a in cb.observer.advice()]
    said = [n for n in cb.observer.notes if "loss unknown" in n]
    assert len(said) == 1 and "compute_loss" in said[0] and "logging_steps=1" in said[0]


def test_an_hf_trainer_logging_every_step_gives_the_loss_it_logs() -> None:
    cb, model, opt, args = _hf_callback(logging_steps=1)
    for loss in (2.5, 2.25, float("nan")):
        _hf_step(cb, model, opt, args, logged=loss)
    records = cb.observer.records()
    assert [r.loss for r in records[:2]] == [2.5, 2.25]
    assert math.isnan(records[2].loss)  # a logged NaN is a real one: still advised
    assert not [n for n in cb.observer.notes if "loss unknown" in n]
    assert "nonfinite-loss" in [a.id for a in cb.observer.advice()]


def test_a_logged_loss_fills_a_record_a_dashboard_made_first_and_takes_the_note_back() -> None:
    cb, model, opt, args = _hf_callback(logging_steps=1)
    ids = torch.zeros(2, 4, dtype=torch.long)
    cb.on_step_begin(args, None, None)
    model(input_ids=ids)["logits"].sum().backward()
    cb.on_step_end(args, None, None, optimizer=opt)
    assert cb.observer.records()[-1].loss is None  # a dashboard's refresh, before on_log
    cb.on_log(args, None, None, logs={"loss": 3.0})
    assert cb.observer.records()[-1].loss == 3.0
    assert not [n for n in cb.observer.notes if "loss unknown" in n]
    assert not [e for e in cb.observer.events if e.kind == "loss-unknown"]


def test_a_lightning_manual_step_returning_nothing_records_unknown() -> None:
    from workbench.integrations import WorkbenchLightningCallback

    cb = WorkbenchLightningCallback(grad_norm=False)
    module = Tiny()
    module.automatic_optimization = False
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    trainer = SimpleNamespace(
        precision="32-true", accumulate_grad_batches=1, gradient_clip_val=None,
        train_dataloader=None, optimizers=[opt], strategy=None,
    )  # fmt: skip
    cb.on_train_start(trainer, module)
    batch = torch.zeros(2, 4, dtype=torch.long)
    for i in range(3):
        cb.on_train_batch_start(trainer, module, batch, i)
        cb.on_before_optimizer_step(trainer, module, opt)
        cb.on_train_batch_end(trainer, module, None, batch, i)
    records = cb.observer.records()
    assert [r.loss for r in records] == [None] * 3
    assert "nonfinite-loss" not in [a.id for a in cb.observer.advice()]
    said = [n for n in cb.observer.notes if "loss unknown" in n]
    assert len(said) == 1 and "training_step" in said[0]


def test_the_dashboard_says_the_loss_is_unknown() -> None:
    from workbench.ui.observer import ObserverPanel

    obs = Observer(None, trainer="lightning", no_loss_note="return the loss from training_step")
    obs.attach(Tiny())
    _steps(obs, [None] * 2)
    panel = ObserverPanel(obs, autostart=False)
    try:
        assert "loss unknown" in panel.status.value
        assert "return the loss from training_step" in panel.settings_html.value
        assert "diverg" not in panel.advice_box.value
    finally:
        panel.close()


@pytest.mark.parametrize("note", [0, b"x", ["a"]])
def test_a_bad_no_loss_note_is_named(note: object) -> None:
    with pytest.raises(ValueError, match=r"no_loss_note=.*must be a string or None"):
        Observer(None, no_loss_note=note)  # type: ignore[arg-type]


LONG = "x" * 5000


def _raises_bounded(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert len(message) < 400 and "xxxx" in message, message
    return message


@pytest.mark.parametrize(
    "call",
    [
        lambda: advise(LONG),
        lambda: advise([LONG]),
        lambda: advise([{"step": 1, "loss": LONG}]),
        lambda: advise([{"step": LONG}]),
        lambda: advise([{"step": 1, "changes": LONG}]),
        lambda: advise([], samples=LONG),
        lambda: advise([], samples=[LONG]),
        lambda: advise([], samples=[{"gpus": [{"util_percent": LONG}]}]),
        lambda: advise([], model_dims=LONG),
        lambda: advise([], model_dims={LONG: LONG}),
        lambda: advise([], gpu_uuid=[LONG]),
        lambda: advise([], config=LONG),
        lambda: advise([], device=LONG),
    ],
    ids=lambda _: "",
)
def test_a_bad_advisor_input_is_named_within_bounds(call) -> None:  # type: ignore[no-untyped-def]
    _raises_bounded(call)


@pytest.mark.parametrize(
    "call",
    [
        lambda: Observer(None, grad_norm=LONG),
        lambda: Observer(LONG),  # type: ignore[arg-type]
        lambda: Observer(Tiny(), LONG),  # type: ignore[arg-type]
        lambda: Observer(Tiny(), config=LONG),  # type: ignore[arg-type]
        lambda: Observer(None, no_loss_note=[LONG]),  # type: ignore[arg-type]
    ],
    ids=lambda _: "",
)
def test_a_bad_observer_argument_is_named_within_bounds(call) -> None:  # type: ignore[no-untyped-def]
    _raises_bounded(call)


def test_a_non_observer_given_to_the_panel_is_named_within_bounds() -> None:
    from workbench.ui.observer import ObserverPanel

    _raises_bounded(lambda: ObserverPanel([LONG], autostart=False))


def test_an_unmapped_trainer_setting_is_noted_within_bounds() -> None:
    from workbench.integrations.hf import settings_from_args
    from workbench.integrations.lightning import settings_from_trainer

    _, _, notes = settings_from_args(SimpleNamespace(optim=LONG))
    assert len(notes) == 1 and len(notes[0]) < 400
    _, _, notes = settings_from_trainer(SimpleNamespace(precision=LONG))
    assert len(notes) == 1 and len(notes[0]) < 400


@pytest.fixture
def loop():  # type: ignore[no-untyped-def]
    model = Tiny()
    with observe(model, torch.optim.SGD(model.parameters(), lr=0.1)) as obs:
        yield obs


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"loss": "abc"}, "loss"),
        ({"loss": [1.0, 2.0]}, "loss"),
        ({"loss": torch.tensor([])}, "loss"),
        ({"loss": 1.0, "grad_norm": "big"}, "grad_norm"),
        ({"loss": 1.0, "grad_norm": torch.ones(3)}, "grad_norm"),
        ({"loss": 1.0, "lr": "fast"}, "lr"),
        ({"loss": 1.0, "samples": "many"}, "samples"),
        ({"loss": 1.0, "samples": -4}, "samples"),
        ({"loss": 1.0, "tokens": 2.5}, "tokens"),
        ({"loss": 1.0, "scale": "x"}, "scale"),
    ],
    ids=lambda v: str(v)[:20],
)
def test_a_bad_step_value_is_named_at_the_call_and_no_record_is_lost(loop, kwargs, named) -> None:  # type: ignore[no-untyped-def]
    obs = loop
    obs.step(2.0)
    with pytest.raises(ValueError, match=rf"^{named}=.*: must "):
        obs.end_step(**kwargs)
    obs.step(1.5, grad_norm=0.5, lr=0.01, samples=4, tokens=32, scale=8.0)
    records = obs.records()
    assert [(r.step, r.loss) for r in records] == [(1, 2.0), (2, 1.5)]
    assert records[1].grad_norm == 0.5 and records[1].samples_per_s > 0
    assert "nonfinite-loss" not in [a.id for a in obs.advice()]


def test_a_grad_norm_given_as_a_tensor_is_read_with_the_step(loop) -> None:  # type: ignore[no-untyped-def]
    obs = loop
    record = obs.step(1.0, grad_norm=torch.tensor(3.0))
    assert record.grad_norm == 3.0


@pytest.mark.parametrize("loss", ["2.0", None, [1.0], True])
def test_a_bad_filled_loss_is_named(loop, loss: object) -> None:  # type: ignore[no-untyped-def]
    obs = loop
    obs.step()
    with pytest.raises(ValueError, match=r"^loss=.*must be a number"):
        obs.fill_loss(loss)  # type: ignore[arg-type]
    assert obs.records()[-1].loss is None


def test_the_device_slots_keep_unknown_and_nan_apart_and_refuse_an_empty_loss() -> None:
    """The path of a GPU run's values (kept in the device slots until the records are
    made), taken on the CPU: a step without a loss is unknown, a NaN loss stays NaN, a
    tensor grad norm is read with the step, an empty loss is refused naming it."""
    obs = Observer(None, grad_norm=False)
    obs.attach(Tiny())
    obs._slots_on_cpu = True  # as a GPU run's tensors: copied into the slots
    obs.end_step(torch.tensor(2.0), grad_norm=torch.tensor(0.5))
    obs.end_step()
    obs.end_step(torch.tensor([float("nan"), 1.0]))
    with pytest.raises(ValueError, match=r"^loss=.*: must hold a value"):
        obs.end_step(torch.zeros(0))
    records = obs.records()
    assert [r.loss for r in records[:2]] == [2.0, None] and math.isnan(records[2].loss)
    assert records[0].grad_norm == 0.5
    assert [a.evidence["steps"] for a in obs.advice() if a.id == "nonfinite-loss"] == [[3]]
