"""`PlainBackend`: a torch optimizer + a precision policy on one device (no DeepSpeed).

Implements the `Backend` contract of `workbench/train/backends/base.py`. Built once per
setting; the Session rebuilds it (carrying `export_state()`) when a setting it reads
changes. It trains your module itself, the same object across rebuilds; under pure bf16
("bf16-true") it trains a private copy cast to bf16 instead (weights, gradients and the
optimizer states the torch optimizer creates in the parameters' dtype, all bf16; floating
inputs cast to bf16 by a forward pre-hook; no autocast, no scaler), and your module keeps
its own dtypes and gets the trained weights back at every switch and at close
(`workbench.train.runtime`). Switching into bf16-true rounds the weights to bf16; back to
fp32 they are exactly the bf16 values, as fp32.

Backend-neutral state (`export_state()`, also what a checkpoint stores):

    {"format": 1,
     "model": {param_name: fp32 tensor},                # named_parameters(), ties once
     "optimizer": {"family": "adam" | "sgd" | None,
                   "state": {param_name: {"exp_avg": ..., "exp_avg_sq": ..., "step": ...}}},
     "scaler": {"scale": float, "growth_tracker": int, "init_scale": float} | None,
     "scheduler": {"steps": int},
     "steps": int,                                      # optimizer steps applied
     "overflow_steps": int}                             # steps the loss scaler skipped

Optimizer states are exported in the dtype they are held in (bf16 under bf16-true) and
cast to the parameter's dtype when loaded, so they carry over between precisions.
Optimizer state moves between optimizers of the same family (adam <-> adamw keep their
moments; sgd keeps its momentum buffer); across families it starts fresh. A loss scale
carries over while `loss_scale_init` is unchanged; a new `loss_scale_init` restarts it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from workbench.config import OptimizerName, TrainConfig
from workbench.train.backends.base import (
    Backend,
    ModelStateBytes,
    StepOutcome,
    frozen_parameters,
    frozen_weights,
    storage_bytes,
)
from workbench.train.backends.optimizer import (
    OPTIMIZER_FAMILY,
    InBackwardOptimizers,
    build_optimizers,
    is_bnb_8bit,
    neutral_state,
    place_bnb_state,
    placed_state,
    set_lr,
)
from workbench.train.schedule import lr_at
from workbench.train.techniques.lora import adapters_in_dtype
from workbench.train.techniques.precision import (
    PrecisionPolicy,
    build_precision,
    cast_floating_inputs,
    restore_scaler,
    scaler_state,
)

STATE_FORMAT = 1


def named_unique_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """`model.named_parameters()` (tied parameters appear once, under their first name)."""
    return list(model.named_parameters())


class PlainBackend(Backend):
    """torch optimizer + autocast/GradScaler policy + LR schedule on the model's device.

    `config.lr` is the learning rate the optimizer uses (the Session passes the value
    after `lr_scaling`). Gradients are divided by `grad_accum` in `backward`.
    `StepOutcome.grad_norm` is the total gradient norm before clipping, every step.
    """

    def __init__(
        self, config: TrainConfig, model: nn.Module, *, state: dict[str, Any] | None = None
    ) -> None:
        self.config = config
        trainable = [p for _, p in named_unique_parameters(model) if p.requires_grad]
        if not trainable:
            raise ValueError("model: has no trainable parameters (requires_grad=True)")
        self.device = trainable[0].device
        self.policy: PrecisionPolicy = build_precision(config, self.device.type)
        self._yours = model
        self._frozen: list[tuple[str, nn.Parameter]] = []
        if self.policy.param_dtype is not None:
            self._frozen = frozen_parameters(model)  # exported from your module, exact
            model = cast_copy(model, self.policy.param_dtype)
            adapters_in_dtype(model, config)  # fp32 adapters when `lora_dtype` says so
        self._model = model
        # forward runs through torch.compile when asked (compiled on the first step)
        self.module: nn.Module = torch.compile(model) if config.compile else model  # type: ignore[assignment]
        self._named = named_unique_parameters(model)
        trainable = [p for _, p in self._named if p.requires_grad]
        self._params = trainable
        self.optimizer = build_optimizers(config, trainable)
        self._in_backward = isinstance(self.optimizer, InBackwardOptimizers)
        self._family = OPTIMIZER_FAMILY[OptimizerName(config.optimizer)]
        self._inv_accum = 1.0 / int(config.grad_accum)
        self._clip = config.clip_grad_norm
        self._base_lr = float(config.lr)
        self.steps = 0
        self.overflow_steps = 0
        self._closed = False
        if state is not None:
            self._load(state)
        self._set_lr()
        self._apply_step = self._step_scaled if self.policy.scaler is not None else self._step_plain
        if self._in_backward:
            self._apply_step = self._step_in_backward
        # the total norm in one foreach kernel when every gradient shares a device and dtype
        # (always, unless your module mixes them); torch's grouping otherwise
        kinds = {(p.device, p.dtype) for p in trainable}
        self._one_kind = len(kinds) == 1 and self.device.type in ("cpu", "cuda")
        self._prepared: torch.Tensor | None = None
        # with one micro-batch the 1/grad_accum factor is 1: no multiply (exact either way)
        scale, inv = self.policy.scale, self._inv_accum
        self._to_backward: Callable[[torch.Tensor], torch.Tensor] = (
            scale if inv == 1.0 else (lambda loss: scale(loss * inv))
        )

    @property
    def zero_stage(self) -> int:
        """No ZeRO: one process holds every state."""
        return 0

    @property
    def trained_module(self) -> nn.Module:
        """Your module itself; under bf16-true the bf16 copy of it."""
        return self._model

    # ------------------------------------------------------------------ the loop
    def autocast(self) -> AbstractContextManager[Any]:
        return self.policy.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self._to_backward(loss).backward()

    def prepare_step(self) -> torch.Tensor | None:
        """Before the optimizer step: the total gradient norm before clipping as a device
        tensor (gradients clipped in place when clip_grad_norm is set), so the step's one
        read (`workbench.train.step.read_device_values`) takes it with the loss; `step()`
        then uses it. None under loss scaling: the scaler unscales first, inside `step()`."""
        if self.policy.scaler is not None or self._in_backward:
            return None  # in backward: each gradient is gone once its parameter stepped
        self._prepared = self._norm_tensor()
        return self._prepared

    def step(self, grad_norm: float | None = None) -> StepOutcome:
        """The optimizer step. `grad_norm`: the value of `prepare_step()`'s tensor, read by
        the caller (read here when not given)."""
        lr = float(
            self.optimizer.param_groups[0]["lr"]
        )  # torchao keeps a tensor, set in place below
        prepared, self._prepared = self._prepared, None
        if prepared is not None:
            if grad_norm is None:
                grad_norm = float(prepared)  # host waits for the device here
            self.optimizer.step()
            skipped, scale = False, None
        else:
            grad_norm, skipped, scale = self._apply_step()
        self.optimizer.zero_grad(set_to_none=True)
        if skipped:
            self.overflow_steps += 1
        else:
            self.steps += 1
            self._set_lr()
        return StepOutcome(grad_norm=grad_norm, skipped=skipped, scale=scale, lr=lr)

    def _norm_tensor(self) -> torch.Tensor:
        """Total gradient norm before clipping, on the device (clipped in place when
        clip_grad_norm is set), with no host-device sync. Reading every gradient once more
        costs about 0.5 ms of a 58 ms tiny-gpt step on one CPU thread (0.8%), 20 us of a
        tiny MLP's 0.5 ms step; the advisor and the panels use it."""
        grads = [p.grad for p in self._params if p.grad is not None]
        if not self._one_kind:
            norm = torch.nn.utils.get_total_norm(grads)
            if self._clip is not None:
                torch.nn.utils.clip_grads_with_norm_(self._params, self._clip, norm)
            return norm
        # torch's get_total_norm and clip_grads_with_norm_, the same kernels, without their
        # grouping by device and dtype (one group here)
        if not grads:  # on the device: the step's one read stacks it with the loss
            return torch.zeros((), dtype=torch.float32, device=self.device)
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        if self._clip is not None:
            torch._foreach_mul_(grads, torch.clamp(self._clip / (norm + 1e-6), max=1.0))
        return norm

    def _grad_norm(self) -> float:
        """`_norm_tensor()` as a number."""
        return float(self._norm_tensor())  # host waits for the device here

    def _step_plain(self) -> tuple[float | None, bool, float | None]:
        norm = self._grad_norm()
        self.optimizer.step()
        return norm, False, None

    def _step_in_backward(self) -> tuple[float | None, bool, float | None]:
        return None, False, None  # stepped in backward; no gradients left for a norm

    def _step_scaled(self) -> tuple[float | None, bool, float | None]:
        scaler = self.policy.scaler
        assert scaler is not None
        scaler.unscale_(self.optimizer)  # before clipping: clip the true gradients
        norm = self._grad_norm()
        before = scaler.get_scale()  # host waits for the device here (loss scaling only)
        scaler.step(self.optimizer)  # skipped when the unscaled grads hold inf/nan (a sync)
        scaler.update()
        after = scaler.get_scale()  # and here
        return norm, after < before, after

    def zero_grad(self) -> None:
        self._prepared = None
        self.optimizer.zero_grad(set_to_none=True)

    def _set_lr(self) -> None:
        set_lr(self.optimizer, lr_at(self.config, self.steps, self._base_lr))

    @property
    def lr(self) -> float:
        """Learning rate of the next optimizer step."""
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ state
    def export_state(self) -> dict[str, Any]:
        ids = {id(p): name for name, p in self._named}
        opt_state: dict[str, dict[str, Any]] = {}
        for p, st in self.optimizer.state.items():
            name = ids.get(id(p))
            if name is not None and st:
                opt_state[name] = neutral_state(st)
        return {
            "format": STATE_FORMAT,
            "model": {name: _fp32(p.detach()) for name, p in self._named}
            | frozen_weights(self._frozen),
            "optimizer": {"family": self._family, "state": opt_state},
            "scaler": scaler_state(self.policy.scaler, self.config),
            "scheduler": {"steps": self.steps},
            "steps": self.steps,
            "overflow_steps": self.overflow_steps,
        }

    def _load(self, state: dict[str, Any]) -> None:
        weights = state.get("model") or {}
        missing = [name for name, _ in self._named if name not in weights]
        if missing:
            raise ValueError(
                f"state: no weights for parameter(s) {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                + "; the state belongs to a different model"
            )
        with torch.no_grad():
            for name, p in self._named:
                w = weights[name]
                if tuple(w.shape) != tuple(p.shape):
                    raise ValueError(
                        f"state: parameter {name} has shape {tuple(w.shape)}, the model "
                        f"has {tuple(p.shape)}"
                    )
                if w.data_ptr() != p.data_ptr():
                    p.copy_(w)
        optim = state.get("optimizer") or {}
        if optim.get("family") is not None and optim.get("family") == self._family:
            by_name = dict(self._named)
            for name, st in (optim.get("state") or {}).items():
                p = by_name.get(name)
                if p is None or not p.requires_grad:
                    continue
                if is_bnb_8bit(self.optimizer):  # bitsandbytes' 8-bit states
                    place_bnb_state(self.optimizer, p, st)
                elif callable(getattr(self.optimizer, "_new_buffer", None)):  # 8-bit states
                    self.optimizer.state[p] = {
                        k: placed_state(self.optimizer, p, k, v) for k, v in st.items()
                    }
                else:
                    self.optimizer.state[p] = {k: _beside(v, p) for k, v in st.items()}
        self.steps = int(state.get("steps", (state.get("scheduler") or {}).get("steps", 0)))
        self.overflow_steps = int(state.get("overflow_steps", 0))
        restore_scaler(self.policy.scaler, state.get("scaler"), self.config)

    def model_state_bytes(self) -> ModelStateBytes:
        """Bytes of parameters, gradients present now, and every optimizer-state tensor
        (including Adam's 4-byte `step` counter per parameter tensor)."""
        params = storage_bytes(p for _, p in self._named) + quant_state_bytes(self._named)
        grads = storage_bytes(p.grad for _, p in self._named if p.grad is not None)
        optim = storage_bytes(v for st in self.optimizer.state.values() for v in st.values())
        return ModelStateBytes(params_bytes=params, grads_bytes=grads, optimizer_bytes=optim)

    def close(self) -> None:
        """Drop the optimizer state and a private bf16 copy (your module stays). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if isinstance(self.optimizer, InBackwardOptimizers):
            self.optimizer.remove()
        self.optimizer.state.clear()
        self.optimizer.param_groups.clear()
        if self._model is not self._yours:
            self._named, self._params, self._frozen = [], [], []
            self._model = self.module = self._yours


def quant_state_bytes(named: list[tuple[str, nn.Parameter]]) -> int:
    """Bytes of the quantisation constants of 4-bit weights (bitsandbytes' `quant_state`:
    absmax, its second level and the code table), which are not parameters themselves."""
    total = 0
    for _, p in named:
        state = getattr(p, "quant_state", None)
        while state is not None:
            parts = ("absmax", "code", "offset")  # offset: the second level's fp32 mean
            for t in (getattr(state, name, None) for name in parts):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
            state = getattr(state, "state2", None)
    return total


def cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A private copy of `model` with its floating parameters and buffers in `dtype` (pure
    bf16), casting floating inputs to `dtype` before each forward; `model` is untouched."""
    twin = copy.deepcopy(model).to(dtype)
    twin.register_forward_pre_hook(cast_floating_inputs(dtype), with_kwargs=True)
    return twin


def _fp32(t: torch.Tensor) -> torch.Tensor:
    """A weight as the neutral state holds it: fp32 (the tensor itself when it is)."""
    return t.float() if t.is_floating_point() and t.dtype != torch.float32 else t


def _beside(value: Any, p: torch.Tensor) -> Any:
    """A saved optimizer-state value on `p`'s device, a floating state tensor in `p`'s dtype
    (bf16 moments into an fp32 optimizer and back); scalars (Adam's step) as they are."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    if value.is_floating_point():
        return value.to(device=p.device, dtype=p.dtype)
    return value.to(p.device)
