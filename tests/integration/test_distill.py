"""Knowledge distillation through the Session: the loss against a hand computation, the
soft and hard losses in the step records, a frozen teacher, and a student refused (and
untouched) when its outputs do not have the teacher's shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench import TrainConfig
from workbench.compress import DistillationLoss, TeacherInputs, distill_session, held_out_split
from workbench.models import build_model

CNN = {"image_size": 8, "classes": 3, "samples": 256}


def _kl_by_hand(student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
    """sum over classes p_t (log p_t - log p_s), averaged over rows, times T^2."""
    s = student.reshape(-1, student.shape[-1]) / t
    q = teacher.reshape(-1, teacher.shape[-1]) / t
    p_t = q.exp() / q.exp().sum(-1, keepdim=True)
    p_s = s.exp() / s.exp().sum(-1, keepdim=True)
    return (p_t * (p_t.log() - p_s.log())).sum(-1).mean() * t * t


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_the_loss_mixes_soft_and_hard_as_documented(alpha) -> None:
    teacher, data, loss_fn, _ = build_model("cnn", channels=8, **CNN)
    student = build_model("cnn", channels=2, seed=1, **CNN)[0]
    x = torch.stack([data[i][0] for i in range(16)])
    y = torch.stack([data[i][1] for i in range(16)])
    loss = DistillationLoss(teacher, hard_loss=loss_fn, temperature=3.0, alpha=alpha)
    out = student(x)
    with torch.no_grad():
        t_out = teacher(x)
    soft = _kl_by_hand(out.detach(), t_out, 3.0)
    hard = F.cross_entropy(out.detach(), y)
    got = loss(out, (x, y))
    torch.testing.assert_close(
        got.detach(), alpha * soft + (1 - alpha) * hard, rtol=1e-5, atol=1e-6
    )
    parts = loss.take_parts()
    assert parts == pytest.approx({"soft": float(soft), "hard": float(hard)}, rel=1e-5, abs=1e-6)
    assert loss.take_parts() is None  # counted afresh after each call
    got.backward()  # gradients reach the student, not the teacher
    assert student.classifier.weight.grad is not None
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())


def test_regression_outputs_use_the_squared_error_to_the_teacher() -> None:
    teacher, data, loss_fn, _ = build_model(
        "mlp", in_features=8, hidden=16, out_features=2, samples=64
    )
    student = build_model("mlp", in_features=8, hidden=4, depth=1, out_features=2, samples=64)[0]
    x = torch.stack([data[i][0] for i in range(8)])
    y = torch.stack([data[i][1] for i in range(8)])
    loss = DistillationLoss(teacher, hard_loss=loss_fn, soft="mse", alpha=0.5)
    out = student(x).detach()
    with torch.no_grad():
        expected = 0.5 * F.mse_loss(out, teacher(x)) + 0.5 * F.mse_loss(out, y)
    torch.testing.assert_close(loss(out, [x, y]), expected)


def test_a_session_trains_the_student_and_records_soft_and_hard_losses() -> None:
    teacher, data, loss_fn, _ = build_model("cnn", channels=8, **CNN)
    student = build_model("cnn", channels=2, seed=1, **CNN)[0]
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in student.state_dict().items()}
    train, _ = held_out_split(data, 0.25)
    config = TrainConfig(micro_batch=16, grad_accum=2, lr=1e-2)
    with distill_session(
        teacher, student, train, hard_loss=loss_fn, temperature=2.0, alpha=0.7, config=config
    ) as session:
        records = session.run(optimizer_steps=4)
    for r in records:
        assert set(r.loss_parts) == {"soft", "hard"}
        # the step's loss is the mean over its micro-batches, and so are its parts
        mixed = 0.7 * r.loss_parts["soft"] + 0.3 * r.loss_parts["hard"]
        assert r.loss == pytest.approx(mixed, rel=1e-5)
        assert "loss parts" in str(r)
    assert r.to_dict()["loss_parts"] == r.loss_parts
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())
    assert any(not torch.equal(v, student_before[k]) for k, v in student.state_dict().items())


def test_records_without_a_reporting_loss_have_no_parts() -> None:
    from workbench import Session

    with Session(TrainConfig(micro_batch=8), model="mlp", model_options={"samples": 64}) as s:
        (record,) = s.run(optimizer_steps=1)
    assert record.loss_parts is None and "loss parts" not in str(record)


def test_a_student_of_another_shape_is_refused_and_untouched() -> None:
    teacher, data, loss_fn, _ = build_model("cnn", channels=8, **CNN)
    student = build_model("cnn", channels=2, classes=5, image_size=8, samples=16)[0]
    student.train()
    before = {k: v.clone() for k, v in student.state_dict().items()}
    with pytest.raises(
        ValueError, match=r"outputs have shape \(2, 5\) but the teacher's have \(2, 3\)"
    ):
        distill_session(teacher, student, data, hard_loss=loss_fn)
    assert student.training and all(
        torch.equal(v, before[k]) for k, v in student.state_dict().items()
    )
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())  # not frozen yet
    wrong_input = build_model("mlp")[0]
    with pytest.raises(ValueError, match="student: fails on the first 2 samples"):
        distill_session(teacher, wrong_input, data, hard_loss=loss_fn)
    with pytest.raises(ValueError, match="is the teacher itself"):
        distill_session(teacher, teacher, data, hard_loss=loss_fn)


def test_bad_settings_are_reported_together() -> None:
    teacher, data, loss_fn, _ = build_model("cnn", channels=8, **CNN)
    with pytest.raises(ValueError, match="4 problems") as info:
        distill_session(teacher, teacher, data, hard_loss=None, temperature=0, alpha=1.5, soft="l1")
    text = str(info.value)
    for part in ("temperature=0", "alpha=1.5", "soft='l1'", "hard_loss=None"):
        assert part in text


def test_the_loss_says_how_to_wrap_unwrapped_data() -> None:
    teacher, data, loss_fn, _ = build_model("cnn", channels=8, **CNN)
    loss = DistillationLoss(teacher, hard_loss=loss_fn)
    x, y = data[0]
    with pytest.raises(ValueError, match="wrap the data in TeacherInputs"):
        loss(teacher(x[None]), y[None])
    inputs, (again, target) = TeacherInputs(data)[0]
    assert torch.equal(inputs, x) and torch.equal(again, x) and torch.equal(target, y)
