"""The contract between the Session's loop and an engine that owns the optimizer.

Two implementations: `PlainBackend` (torch optimizer + precision policy, in
`workbench/train/plain.py`) and `DeepSpeedBackend` (ZeRO stages 0-3 and DeepSpeed
16-bit, in `workbench/train/zero.py`). The Session's hot loop is the same for both:

    for micro in range(grad_accum):
        batch = next(data)                      # timed as data_seconds
        with backend.autocast():
            out = backend.module(inputs)
        loss = loss_fn(out.float(), targets)    # loss in fp32
        backend.backward(loss)                  # divides by grad_accum itself
    outcome = backend.step()                    # clip, (un)scale, optimizer, scheduler

The loop never branches on precision or ZeRO stage: the backend was built for the
settings once and is rebuilt (carrying weights and optimizer state) when they change.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class StepOutcome:
    grad_norm: float | None  # total gradient norm before clipping, None if not computed
    skipped: bool  # True when the optimizer step was not applied (overflow)
    scale: float | None  # current loss scale, None without loss scaling
    lr: float  # learning rate used for this step


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes counted from this process's own tensors."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int


@runtime_checkable
class Backend(Protocol):
    module: torch.nn.Module  # what forward is called on (the model, or a DeepSpeed engine)

    def autocast(self) -> AbstractContextManager[Any]: ...

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's mean loss; scales by 1/grad_accum internally."""

    def step(self) -> StepOutcome:
        """Finish the optimizer step after grad_accum backward calls."""

    def zero_grad(self) -> None:
        """Drop accumulated gradients without stepping (used when a step is abandoned)."""

    def export_state(self) -> dict[str, Any]:
        """Full fp32 weights + optimizer/scaler/scheduler state in a backend-neutral form,
        for carrying into a new backend or writing a checkpoint."""

    def model_state_bytes(self) -> ModelStateBytes: ...

    def close(self) -> None:
        """Release everything (engines, process groups, buffers). Idempotent."""


def build_backend(
    config: Any,
    model: torch.nn.Module,
    *,
    state: dict[str, Any] | None = None,
    world_size: int = 1,
    device: torch.device | None = None,
) -> Backend:
    """The backend for `config`: `PlainBackend` unless the config needs DeepSpeed
    (`config.uses_deepspeed`) or the run has several ranks (`world_size > 1`), in which
    case `workbench.train.zero.DeepSpeedBackend` (imported only then) on `device` (the
    session's; default: DeepSpeed's accelerator device for this rank). `PlainBackend`
    trains `model` where it is."""
    if config.uses_deepspeed or world_size > 1:
        try:
            from workbench.train.zero import DeepSpeedBackend  # type: ignore[attr-defined]
        except ImportError as exc:
            raise ValueError(
                f"zero_stage={config.zero_stage}, precision={config.precision}, "
                f"world_size={world_size}: needs the DeepSpeed backend "
                f"(workbench.train.zero.DeepSpeedBackend), which is not available: {exc}"
            ) from exc
        return DeepSpeedBackend(config, model, state=state, device=device)  # type: ignore[no-any-return]
    from workbench.train.plain import PlainBackend

    return PlainBackend(config, model, state=state)
