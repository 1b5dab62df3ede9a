"""The values of an observed step, as the `Observer` reads them without waiting for the
device: the gradient-norm schedule (`grad_norm_every`, `norm_interval`), the device slots
the pending steps' losses, norms and loss scales are copied into (`StepSlots`, read in one
copy at a flush), a tensor's value read now (`number`), the checks of a value a record
holds (`real_value`), and a batch's samples and tokens (`batch_size`)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from workbench.inputs import shown

#: The columns of a pending step's device values, and the mark of a value kept there.
LOSS, NORM, SCALE = 0, 1, 2
COLUMNS = ("loss", "grad_norm", "scale")
ON_DEVICE = object()

#: `grad_norm="auto"`: the share of the step the gradient norm may cost the host. Above it
#: the norm is taken every k-th step, the smallest k that keeps its cost under this share.
NORM_BUDGET = 0.001


def grad_norm_every(value: bool | int | str) -> int | None:
    """The `grad_norm` argument as a fixed interval: True -> 1 (every step), an int k >= 1
    -> k, False -> 0 (never), "auto" -> None (chosen from the measured costs:
    `norm_interval`). ValueError naming the value and what is allowed else."""
    if value is True or value is False:
        return int(value)
    if value == "auto":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(
        f"grad_norm={shown(value)}: must be True (every step), False (never), an int k >= 1 "
        "(every k-th step) or 'auto' (every step while it costs under "
        f"{NORM_BUDGET:.1%} of the step, else every k-th)"
    )


def norm_interval(norm_seconds: float, step_seconds: float, budget: float = NORM_BUDGET) -> int:
    """How many steps apart `grad_norm="auto"` takes the norm: 1 while the norm's host time
    (`norm_seconds`) is at most `budget` of the step (`step_seconds`), else the smallest k
    with norm_seconds / k <= budget * step_seconds (at most 1000 steps apart)."""
    if step_seconds <= 0 or norm_seconds <= budget * step_seconds:
        return 1
    return min(1000, math.ceil(norm_seconds / (budget * step_seconds)))


class StepSlots:
    """The pending steps' device values (loss, gradient norm, loss scale), each step's
    copied into its row of one float32 buffer on the device: no tensor of the trainer's is
    kept until the flush (a step's own small tensors held that long slow the steps after
    it, by 3-5% on a CPU here: the allocator's heap stays fragmented), and the rows are read
    in one copy. Row r of column c is a view made once (`cells`), written in place."""

    def __init__(self, device: torch.device, rows: int) -> None:
        self.device = device
        self.buffer = torch.zeros(rows, 3, dtype=torch.float32, device=device)
        self.cells = [row.unbind() for row in self.buffer.unbind()]

    def put(self, row: int, column: int, value: torch.Tensor, add: bool) -> None:
        if value.requires_grad:
            value = value.detach()
        if value.dim():  # one value a step: a per-sample loss counts as its mean
            if not value.numel():
                raise empty_value(COLUMNS[column], value)
            value = value.reshape(()) if value.numel() == 1 else value.float().mean()
        cell = self.cells[row][column]
        if add:
            cell.add_(value.to(self.device) if value.device != self.device else value)
        else:
            cell.copy_(value)

    def read(self) -> list[list[float]]:
        rows: list[list[float]] = self.buffer.tolist()
        return rows


def number(value: torch.Tensor, name: str = "loss") -> float:
    """A tensor's value, now (a DTensor's full value; a tensor of several values, a
    per-sample loss, counts as their mean; an empty one is refused, naming `name`)."""
    if type(value) is torch.Tensor and value.numel() == 1:
        return value.item()
    if not value.numel():
        raise empty_value(name, value)
    full = getattr(value, "full_tensor", None)
    if callable(full):
        value = full()
    return float(value.detach().float().mean())


def empty_value(name: str, value: torch.Tensor) -> ValueError:
    return ValueError(
        f"{name}={shown(value)}: must hold a value (an empty tensor has none; a per-sample "
        "value counts as its mean)"
    )


def real_value(name: str, value: Any) -> Any:
    """`value` when it is a real number or a tensor of one real value, else ValueError
    naming `name` (a value the step's record could not hold)."""
    if isinstance(value, torch.Tensor):
        if value.numel() == 1 and not value.is_complex():
            return value
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value
    raise ValueError(f"{name}={shown(value)}: must be a real number, a one-value tensor or None")


def batch_size(batch: Any) -> tuple[int, int]:
    """(samples, tokens) of a batch: its token ids' shape (a dict's `input_ids`, a tuple's
    first tensor), tokens only for integer ids."""
    ids = batch
    kind = type(batch)
    if kind is torch.Tensor:  # the common layouts first: no abstract-class check
        pass
    elif kind is tuple or kind is list:
        ids = batch[0] if batch else None
    elif kind is dict or isinstance(batch, Mapping):
        ids = batch.get("input_ids", next(iter(batch.values()), None))
    elif isinstance(batch, (tuple, list)) and batch:
        ids = batch[0]
    if isinstance(ids, torch.Tensor):
        shape = ids.shape
        if not shape:
            return 0, 0
        tokens = shape[0] * shape[1] if len(shape) == 2 and not ids.dtype.is_floating_point else 0
        return shape[0], tokens
    return 0, 0


def device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0
