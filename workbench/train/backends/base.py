"""The contract between the Session's loop and an engine that owns the optimizer.

Implementations live beside this file, one per engine: `PlainBackend` (torch optimizer +
precision policy, `plain.py`) and the engines over a process group, which share one
lifecycle (`distributed.DistributedBackend`: DeepSpeed, FSDP2, tensor parallel, pipeline);
`workbench.train.backends.build_backend` builds the one `workbench.engines` picks.
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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

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
    """Every hook the Session's loop, its runtime and its memory probe call on an engine.
    The engines subclass it (the plain loop directly, the distributed ones through
    `distributed.DistributedBackend`), so the optional hooks have their defaults here and
    no caller probes for one."""

    module: torch.nn.Module  # what forward is called on (the model, or a DeepSpeed engine)
    #: the torch optimizer the backend steps, for its notes and step counters (None when
    #: the engine keeps its own: DeepSpeed's)
    optimizer: Any
    #: True when `train_step` runs a step's forwards and backwards itself (a pipeline's
    #: schedule); then the loop reads the batches and calls it instead of `backward`
    runs_whole_step: ClassVar[bool] = False

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage the engine itself runs (0 without DeepSpeed): what records carry."""

    @property
    def trained_module(self) -> torch.nn.Module:
        """The module whose parameters the engine updates: the model itself, or the
        engine's own copy of it (DeepSpeed, FSDP)."""

    @property
    def lr(self) -> float:
        """Learning rate of the next optimizer step."""

    def autocast(self) -> AbstractContextManager[Any]: ...

    def loss_context(self) -> AbstractContextManager[Any]:
        """Where the loss is computed (the tensor-parallel engine's vocabulary-parallel
        cross-entropy); nothing by default."""
        return nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's mean loss; scales by 1/grad_accum internally."""

    def train_step(self, batches: list[Any], loss_fn: Any) -> torch.Tensor:
        """Forward and backward of a step's micro-batches at once (`runs_whole_step`); the
        sum of their losses."""
        raise NotImplementedError(f"{type(self).__name__} trains micro-batch by micro-batch")

    def prepare_step(self) -> torch.Tensor | None:
        """The gradient norm as a device tensor before `step` (read once with the loss:
        the plain loop's), or None: `step` computes its own."""
        return None

    def step(self) -> StepOutcome:
        """Finish the optimizer step after grad_accum backward calls."""

    def zero_grad(self) -> None:
        """Drop accumulated gradients without stepping (used when a step is abandoned)."""

    def probe(self, loss_fn: Any, batch: Any) -> tuple[Any, ModelStateBytes] | None:
        """The engine's own memory probe of one micro-batch (a pipeline measures a whole
        step of its stage), or None: the Session's probe measures a forward and backward."""
        return None

    def pipeline_report(self) -> dict[str, Any] | None:
        """This rank's place in a pipeline and the last step's bubble (None: no pipeline)."""
        return None

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
