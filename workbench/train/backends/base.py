"""The contract between the Session's loop and an engine that owns the optimizer.

Implementations live beside this file, one per engine: `PlainBackend` (torch optimizer +
precision policy, `plain.py`) and `DeepSpeedBackend` (ZeRO stages 0-3 and DeepSpeed
16-bit, `deepspeed.py`); `workbench.train.backends.build_backend` picks one for a config.
The Session's hot loop is the same for all:

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

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn


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

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage the engine itself runs (0 without DeepSpeed): what records carry."""

    @property
    def trained_module(self) -> torch.nn.Module:
        """The module whose parameters the engine updates: the model itself, or the
        engine's own copy of it (DeepSpeed, FSDP)."""

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


def storage_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages behind `tensors` (shared storage counted once; a
    DTensor counts its local shard's storage, padding included)."""
    seen: dict[int, int] = {}
    for t in _plain_tensors(tensors):
        if t.device.type != "meta":
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _plain_tensors(tensors: Any) -> Any:
    """The plain tensors behind `tensors`: a DTensor's local shard, a wrapper subclass's
    inner tensors (torchao's 8-bit optimizer states: codes, scales, quantization map)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for t in tensors:
        local = getattr(t, "_local_tensor", None)
        if isinstance(local, torch.Tensor):
            t = local
        if not isinstance(t, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            yield from _plain_tensors(getattr(t, n) for n in names)
        else:
            yield t


def rank_device() -> torch.device:
    """This rank's device when none is given: its GPU (LOCAL_RANK) if CUDA is available,
    else the CPU (every distributed engine's default)."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def load_full_weights(module: nn.Module, state: dict[str, Any]) -> None:
    """Copy a backend-neutral state's full fp32 weights by name into a whole (not yet
    sharded, split or cut) copy of the model; ValueError naming a missing or misshapen
    parameter."""
    weights = state.get("model") if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise ValueError("state: must be a dict with a 'model' entry of fp32 weights by name")
    with torch.no_grad():
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            if name not in weights:
                raise ValueError(
                    f"state: no weights for parameter {name}; the state belongs to a different "
                    "model"
                )
            w = weights[name]
            if tuple(w.shape) != tuple(p.shape):
                raise ValueError(
                    f"state: parameter {name} has shape {tuple(w.shape)}, the model has "
                    f"{tuple(p.shape)}"
                )
            p.copy_(w.to(p.device, p.dtype))


def frozen_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Your module's parameters that do not train (LoRA's frozen base), by name. An engine
    that trains a copy of your module (DeepSpeed's, FSDP's, the plain loop's bf16 copy
    under "bf16-true") keeps these to export from your module itself: it
    holds them exactly (the engine's copy may be 16-bit), and a LoRA switch merges the
    adapters trained so far into them, so a state without them (a checkpoint) would lose
    that training."""
    return [(n, p) for n, p in model.named_parameters() if not p.requires_grad]


def frozen_weights(params: list[tuple[str, nn.Parameter]]) -> dict[str, torch.Tensor]:
    """`frozen_parameters`' weights in fp32 (no copy when they are already: an engine's
    your module is in host memory)."""
    return {n: p.detach().float() for n, p in params}
