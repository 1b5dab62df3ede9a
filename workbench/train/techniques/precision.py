"""Precision policies: one object per setting, built once, so the loop has no mode checks.

    policy = build_precision(config, device_type="cpu")
    with policy.autocast():
        out = model(x)
    loss = loss_fn(out.float(), y)          # loss in fp32, outside autocast
    policy.scale(loss).backward()

* fp32: no autocast, no scaler.
* amp-bf16: `torch.autocast(dtype=bfloat16)`; bf16 has fp32's exponent range, no scaler.
* amp-fp16: `torch.autocast(dtype=float16)` + `torch.amp.GradScaler` with the config's
  loss_scale_init / growth / backoff / interval. Steps whose gradients overflow are
  skipped by the scaler and counted by the backend.
* bf16-true (pure bf16, Lightning's name): no autocast, no scaler; `param_dtype` is
  bfloat16, the dtype the engine casts its private copy of your module to, so weights,
  gradients and optimizer states (torch optimizers create them in the parameter's dtype)
  are all bf16, with no fp32 master copy. `cast_floating_inputs` is the forward pre-hook
  that casts floating inputs to it (integer token ids stay as they are). Every update is
  rounded to bf16's 8-bit mantissa: an update below 2^-8 of a weight is lost.

CPU autocast in torch 2.x supports both bfloat16 and float16 (`GradScaler("cpu")`
exists since torch 2.3). The DeepSpeed 16-bit modes (fp16, bf16) are not policies here:
the DeepSpeed engine owns its precision.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from workbench.config import Precision, TrainConfig
from workbench.inputs import shown

_AMP_DTYPES = {Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16}
#: The dtype an engine casts its copy of your module to (weights, gradients, states).
PURE_DTYPES = {Precision.BF16_TRUE: torch.bfloat16}


def _identity(loss: torch.Tensor) -> torch.Tensor:
    return loss


@dataclass(frozen=True)
class PrecisionPolicy:
    """Autocast context factory + optional GradScaler for one precision setting."""

    precision: Precision
    device_type: str
    dtype: torch.dtype | None  # autocast dtype; None without autocast (fp32, bf16-true)
    scaler: torch.amp.GradScaler | None
    autocast: Callable[[], AbstractContextManager[Any]]
    scale: Callable[[torch.Tensor], torch.Tensor]  # the scaler's scale(), or identity
    param_dtype: torch.dtype | None = None  # pure bf16: the trained copy's dtype; None: yours

    @property
    def activation_dtype(self) -> torch.dtype:
        return self.dtype or self.param_dtype or torch.float32


def cast_floating_inputs(dtype: torch.dtype) -> Any:
    """A forward pre-hook (`register_forward_pre_hook(..., with_kwargs=True)`) casting the
    floating tensors among a module's arguments to `dtype`; other values (integer token
    ids, masks of bools) pass unchanged."""

    def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        def cast(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
                return x.to(dtype)
            return x

        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    return hook


def amp_supported(precision: Precision | str, device_type: str) -> str | None:
    """None when `precision` runs on `device_type`, else a one-line reason."""
    p = Precision(precision)
    bf16 = p in (Precision.AMP_BF16, Precision.BF16_TRUE)
    if bf16 and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU does not support bfloat16 (compute capability < 8.0)"
    if p not in _AMP_DTYPES:
        return None
    if not torch.amp.autocast_mode.is_autocast_available(device_type):
        return f"torch {torch.__version__} has no autocast for device {shown(device_type)}"
    return None


def build_precision(config: TrainConfig, device_type: str) -> PrecisionPolicy:
    """The policy for `config.precision` on `device_type` ("cpu" or "cuda")."""
    p = Precision(config.precision)
    if p.is_deepspeed:
        raise ValueError(
            f"precision={p.value!r}: is DeepSpeed's 16-bit mode and runs through the DeepSpeed "
            "backend; the plain backend supports fp32, amp-bf16, amp-fp16 and bf16-true"
        )
    reason = amp_supported(p, device_type)
    if reason:
        raise ValueError(f"precision={p.value!r}: not available here: {reason}")
    dtype = _AMP_DTYPES.get(p)
    if dtype is None:
        pure = PURE_DTYPES.get(p)
        return PrecisionPolicy(p, device_type, None, None, nullcontext, _identity, pure)

    def autocast() -> AbstractContextManager[Any]:
        return torch.autocast(device_type=device_type, dtype=dtype)

    scaler = None
    scale = _identity
    if p is Precision.AMP_FP16:
        scaler = torch.amp.GradScaler(
            device_type,
            init_scale=float(config.loss_scale_init),
            growth_factor=float(config.loss_scale_growth),
            backoff_factor=float(config.loss_scale_backoff),
            growth_interval=int(config.loss_scale_interval),
        )
        scale = scaler.scale
    return PrecisionPolicy(p, device_type, dtype, scaler, autocast, scale)


def scaler_state(scaler: Any, config: Any) -> dict[str, Any] | None:
    """A GradScaler's state as plain numbers for a checkpoint or an engine switch (None
    without one): the scale, the clean steps since it last grew, the initial scale it
    started from (a state carries over only to a scaler that starts from the same)."""
    if scaler is None:
        return None
    return {
        "scale": float(scaler.get_scale()),
        "growth_tracker": int(scaler.state_dict().get("_growth_tracker", 0)),
        "init_scale": float(config.loss_scale_init),
    }


def restore_scaler(scaler: Any, saved: dict[str, Any] | None, config: Any) -> None:
    """Give `scaler` the scale `scaler_state` saved, when both start from the same initial
    scale (a changed `loss_scale_init` starts afresh); growth and backoff from `config`."""
    if scaler is None or not saved:
        return
    if float(saved.get("init_scale", -1)) != float(config.loss_scale_init):
        return
    scaler.load_state_dict(
        {
            "scale": float(saved["scale"]),
            "growth_factor": float(config.loss_scale_growth),
            "backoff_factor": float(config.loss_scale_backoff),
            "growth_interval": int(config.loss_scale_interval),
            "_growth_tracker": int(saved.get("growth_tracker", 0)),
        }
    )
