"""Training engines behind one contract (`base.Backend`), one file per engine.

    plain.py       PlainBackend: a torch optimizer + precision policy on one device
    deepspeed.py   DeepSpeedBackend: ZeRO stages 0-3, offload and DeepSpeed 16-bit
    fsdp.py        FSDPBackend: PyTorch FSDP2 full_shard / shard_grad_op / no_shard
    tensor_parallel.py  TensorParallelBackend: `tp` > 1, data parallel or FSDP2 over the rest
    pipeline.py    PipelineBackend: `pp` > 1 stages (1F1B or GPipe), data parallel over the rest
    process_group.py  the default process group the distributed engines share

`build_backend(config, model, ...)` builds the engine `workbench.engines.engine_for` picks
(`BACKENDS`, from the engines' rows, maps each `Engine` to its class); engines are imported
only when picked, so a plain run never imports DeepSpeed. A new engine is one `Engine`
member, its row in `workbench.engines` and one file here (a `DistributedBackend` subclass,
distributed.py, when it spans ranks).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from workbench.config import Engine, TrainConfig
from workbench.engines import ENGINES, engine_for
from workbench.train.backends.base import Backend, ModelStateBytes, StepOutcome

__all__ = ["BACKENDS", "Backend", "ModelStateBytes", "StepOutcome", "build_backend"]


#: The backend class of each engine, as "module:Class" (imported when picked): the rows'.
BACKENDS: dict[Engine, str] = {engine: row.backend for engine, row in ENGINES.items()}


def build_backend(
    config: TrainConfig,
    model: torch.nn.Module,
    *,
    state: dict[str, Any] | None = None,
    world_size: int = 1,
    device: torch.device | None = None,
) -> Backend:
    """The backend of `engine_for(config, world_size)`. `PlainBackend` trains `model` where
    it is; the distributed engines run on `device` (the session's; default: this rank's
    GPU, else the CPU) and train a copy of `model`. `state`: what `export_state()` of
    another backend returned, carried into the new one (weights, optimizer, loss scale)."""
    engine = engine_for(config, world_size)
    module_name, _, class_name = BACKENDS[engine].partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:
        raise ValueError(
            f"zero_stage={config.zero_stage}, precision={config.precision}, fsdp={config.fsdp}, "
            f"world_size={world_size}: needs the {engine.value} backend, which is not "
            f"available: {exc}"
        ) from exc
    if engine is Engine.PLAIN:
        backend: Backend = cls(config, model, state=state)
    else:
        backend = cls(config, model, state=state, device=device)
    return backend
