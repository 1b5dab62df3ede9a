"""Knowledge distillation: a small student learns from a frozen teacher's outputs, as a
loss the workbench `Session` trains with.

    session = distill_session(teacher, student, train_data, hard_loss=F.cross_entropy,
                              temperature=4.0, alpha=0.7, config=TrainConfig(micro_batch=64))
    session.run(optimizer_steps=200)
    session.history[-1].loss_parts        # {"soft": ..., "hard": ...}

The loss of one batch (Hinton et al., 2015), with T the temperature and alpha the mixing
weight:

    soft = T^2 * KL(softmax(teacher / T) || softmax(student / T))   (soft="kl", logits)
    soft = mean((student - teacher)^2)                                (soft="mse", regression)
    hard = hard_loss(student outputs, targets)                        (the task's own loss)
    loss = alpha * soft + (1 - alpha) * hard

The KL divergence is over the last dimension (classes, or the vocabulary at every position
of a sequence) and averaged over everything before it; T^2 keeps the soft gradients'
size independent of T. A higher T shows the student more of the teacher's ranking of
the wrong answers; alpha=0 is ordinary training on the targets, alpha=1 learns from the
teacher alone.

How it plugs into the Session: the student is the Session's model and `DistillationLoss`
its `loss_fn`. A loss only sees the student's outputs and the targets, so the data are
wrapped (`TeacherInputs`) to carry each sample's inputs along with its target; the loss
runs the teacher on them, without gradients, in eval mode, in fp32. The Session asks the
loss for the mean soft and hard losses of each optimizer step (`take_parts`) and puts
them in the step's record (`StepRecord.loss_parts`).

The teacher is frozen when the loss is built (`requires_grad_(False)`, eval mode) and
moved to the device of the batches it sees. Nothing of the student is changed before
training: a student whose outputs do not have the teacher's shape is refused with a
ValueError when the session is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workbench.compress.layers import raise_problems
from workbench.compress.measure import eval_mode
from workbench.inputs import shown
from workbench.train import batches

SOFT = ("kl", "mse")


class TeacherInputs(Dataset[Any]):
    """A data set of (inputs, targets) pairs whose samples carry their inputs twice:
    `(inputs, (inputs, targets))`, so that a `DistillationLoss` can run the teacher."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        if isinstance(dataset, DataLoader) or not isinstance(dataset, Dataset):
            raise ValueError(
                f"data={type(dataset).__name__}: distillation needs a map-style torch Dataset "
                "of (inputs, targets) pairs (the Session builds the DataLoader)"
            )
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Any, tuple[Any, Any]]:
        sample = self.dataset[i]
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise ValueError(
                f"data: sample {i} is {batches.describe(sample)}; distillation needs "
                "(inputs, targets) pairs"
            )
        inputs, targets = sample
        return inputs, (inputs, targets)


def loss_problems(temperature: Any, alpha: Any, soft: Any, hard_loss: Any) -> list[str]:
    """What is wrong with distillation settings (empty when they are usable)."""
    problems = []
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        problems.append(
            f"temperature={shown(temperature)}: must be a number > 0 (1 = plain softmax)"
        )
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float))
        or not math.isfinite(alpha)
        or not 0 <= alpha <= 1
    ):
        problems.append(
            f"alpha={shown(alpha)}: must be a number in [0, 1] (the soft loss's weight; the hard "
            "loss gets 1 - alpha)"
        )
    if soft not in SOFT:
        problems.append(
            f"soft={shown(soft)}: must be 'kl' (outputs are logits) or 'mse' (regression outputs)"
        )
    if not callable(hard_loss):
        problems.append(
            f"hard_loss={shown(hard_loss)}: must be callable(outputs, targets), the task's own loss "
            "(e.g. torch.nn.functional.cross_entropy)"
        )
    return problems


class DistillationLoss:
    """`loss_fn(student_outputs, (inputs, targets))` for a Session (module docstring).

    `teacher`: the trained model (frozen here). `hard_loss(outputs, targets)`: the task's
    loss. `temperature` (> 0), `alpha` (in [0, 1]): the settings. `soft`: "kl" for logits,
    "mse" for regression outputs (the temperature does not apply then).
    """

    def __init__(
        self,
        teacher: nn.Module,
        *,
        hard_loss: Callable[[Any, Any], torch.Tensor],
        temperature: float = 2.0,
        alpha: float = 0.5,
        soft: str = "kl",
    ) -> None:
        problems: list[str] = (
            []
            if isinstance(teacher, nn.Module)
            else [f"teacher={type(teacher).__name__}: must be a torch.nn.Module"]
        )
        raise_problems(problems + loss_problems(temperature, alpha, soft, hard_loss))
        self.teacher = teacher.eval().requires_grad_(False)
        self.hard_loss = hard_loss
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.soft = soft
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0

    def __repr__(self) -> str:
        return (
            f"DistillationLoss(teacher={type(self.teacher).__name__}, soft={self.soft!r}, "
            f"temperature={self.temperature:g}, alpha={self.alpha:g})"
        )

    def teacher_outputs(self, inputs: Any) -> torch.Tensor:
        """The teacher's fp32 outputs for `inputs` (no gradients, eval mode)."""
        device = inputs.device if isinstance(inputs, torch.Tensor) else None
        first = next(self.teacher.parameters(), None)
        if device is not None and first is not None and first.device != device:
            self.teacher.to(device)
        with torch.no_grad():
            out = self.teacher(inputs)
        out = getattr(out, "logits", out)
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"teacher: returned {type(out).__name__}; distillation needs a tensor of outputs"
            )
        return out.float()

    def __call__(self, outputs: Any, targets: Any) -> torch.Tensor:
        if not isinstance(targets, (tuple, list)) or len(targets) != 2:
            raise ValueError(
                "DistillationLoss: the targets are not (inputs, targets); wrap the data in "
                "TeacherInputs(dataset) (distill_session does) so the loss can run the teacher"
            )
        inputs, hard_targets = targets
        student = getattr(outputs, "logits", outputs)
        if not isinstance(student, torch.Tensor):
            raise ValueError(
                f"student: returned {type(outputs).__name__}; distillation needs a tensor"
            )
        teacher = self.teacher_outputs(inputs)
        if teacher.shape != student.shape:
            raise ValueError(
                f"student: its outputs have shape {tuple(student.shape)} but the teacher's "
                f"have {tuple(teacher.shape)} on the same batch; distillation compares them "
                "element by element (same classes or vocabulary)"
            )
        student = student.float()
        if self.soft == "kl":
            t = self.temperature
            classes = student.shape[-1]
            log_s = F.log_softmax(student.reshape(-1, classes) / t, dim=-1)
            log_t = F.log_softmax(teacher.reshape(-1, classes) / t, dim=-1)
            soft = F.kl_div(log_s, log_t, reduction="batchmean", log_target=True) * t * t
        else:
            soft = F.mse_loss(student, teacher)
        hard = self.hard_loss(outputs, hard_targets)
        self._add("soft", soft)
        self._add("hard", hard)
        self._count += 1
        return self.alpha * soft + (1 - self.alpha) * hard

    def _add(self, name: str, value: torch.Tensor) -> None:
        value = value.detach().float()
        self._sums[name] = value if name not in self._sums else self._sums[name] + value

    def take_parts(self) -> dict[str, float] | None:
        """The mean soft and hard losses of the batches since the last call (None when
        there were none), and start counting afresh. The Session calls this once at the
        start of every optimizer step and once after its micro-batches."""
        if not self._count:
            return None
        parts = {name: float(total) / self._count for name, total in self._sums.items()}
        self._sums, self._count = {}, 0
        return parts


def check_student(
    teacher: nn.Module, student: nn.Module, data: Dataset[Any], *, batch: int = 2
) -> None:
    """ValueError unless `student` gives outputs of the teacher's shape on the first
    samples of `data`. Both run in eval mode without autograd; neither is changed."""
    problems: list[str] = []
    for name, model in (("teacher", teacher), ("student", student)):
        if not isinstance(model, nn.Module):
            problems.append(f"{name}={type(model).__name__}: must be a torch.nn.Module")
    if not problems and teacher is student:
        problems.append("student: is the teacher itself; distill into a separate (smaller) model")
    raise_problems(problems)
    sample = next(iter(DataLoader(TeacherInputs(data), batch_size=batch)))
    inputs = sample[0]
    shapes = []
    for name, model in (("teacher", teacher), ("student", student)):
        first = next(model.parameters(), None)
        x = inputs.to(first.device) if first is not None else inputs
        try:
            with eval_mode(model):
                out = model(x)
        except Exception as exc:
            raise ValueError(
                f"{name}: fails on the first {batch} samples of data "
                f"({batches.describe(inputs)}): {type(exc).__name__}: {exc}"
            ) from exc
        out = getattr(out, "logits", out)
        shapes.append(tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__)
    if shapes[0] != shapes[1]:
        raise ValueError(
            f"student: its outputs have shape {shapes[1]} but the teacher's have {shapes[0]} "
            f"on the same {batch} samples; distillation compares them element by element, so "
            "the student must predict the same classes (or vocabulary) in the same layout"
        )


def distill_session(
    teacher: nn.Module,
    student: nn.Module,
    data: Dataset[Any],
    *,
    hard_loss: Callable[[Any, Any], torch.Tensor],
    temperature: float = 2.0,
    alpha: float = 0.5,
    soft: str = "kl",
    config: Any | None = None,
    **session_options: Any,
) -> Any:
    """A `workbench.Session` that trains `student` on `data` with a `DistillationLoss`
    from the frozen `teacher`. Every check runs first (the settings, then the student's
    output shape against the teacher's on the first samples): on a ValueError nothing was
    built and neither model changed. `session_options` go to `Session` (`sampler`,
    `device`, ...)."""
    raise_problems(loss_problems(temperature, alpha, soft, hard_loss))
    check_student(teacher, student, data)
    from workbench.train.session import Session

    loss = DistillationLoss(
        teacher, hard_loss=hard_loss, temperature=temperature, alpha=alpha, soft=soft
    )
    return Session(config, model=student, data=TeacherInputs(data), loss_fn=loss, **session_options)
