"""Training engines behind one contract (`base.Backend`), one file per engine.

    plain.py       PlainBackend: a torch optimizer + precision policy on one device
    deepspeed.py   DeepSpeedBackend: ZeRO stages 0-3, offload and DeepSpeed 16-bit

`build_backend(config, model, ...)` picks the engine a config needs; engines are imported
only when picked, so a plain run never imports DeepSpeed.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.train.backends.base import Backend, ModelStateBytes, StepOutcome

__all__ = ["Backend", "ModelStateBytes", "StepOutcome", "build_backend"]


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
    case `DeepSpeedBackend` on `device` (the session's; default: this rank's GPU, else the
    CPU). `PlainBackend` trains `model` where it is. `state`: what `export_state()` of
    another backend returned, carried into the new one (weights, optimizer, loss scale)."""
    if config.uses_deepspeed or world_size > 1:
        try:
            from workbench.train.backends.deepspeed import DeepSpeedBackend
        except ImportError as exc:
            raise ValueError(
                f"zero_stage={config.zero_stage}, precision={config.precision}, "
                f"world_size={world_size}: needs the DeepSpeed backend, which is not "
                f"available: {exc}"
            ) from exc
        return DeepSpeedBackend(config, model, state=state, device=device)
    from workbench.train.backends.plain import PlainBackend

    return PlainBackend(config, model, state=state)
