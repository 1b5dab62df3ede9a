"""Training engines behind one contract (`base.Backend`), one file per engine.

    plain.py       PlainBackend: a torch optimizer + precision policy on one device
    deepspeed.py   DeepSpeedBackend: ZeRO stages 0-3, offload and DeepSpeed 16-bit
    fsdp.py        FSDPBackend: PyTorch FSDP2 full_shard / shard_grad_op / no_shard
    process_group.py  the default process group the distributed engines share

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
    """The backend for `config`: `FSDPBackend` when `config.fsdp` is not "off";
    `DeepSpeedBackend` when the config needs DeepSpeed (`config.uses_deepspeed`) or the
    run has several ranks (`world_size > 1`); else `PlainBackend`, which trains `model`
    where it is. The distributed engines run on `device` (the session's; default: this
    rank's GPU, else the CPU) and train a copy of `model`. `state`: what `export_state()`
    of another backend returned, carried into the new one (weights, optimizer, loss
    scale)."""
    from workbench.config import FsdpMode

    if FsdpMode(config.fsdp) is not FsdpMode.OFF:
        from workbench.train.backends.fsdp import FSDPBackend

        return FSDPBackend(config, model, state=state, device=device)
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
