"""The arguments of a dry run (`workbench.train.dry_run.simulate_memory`), checked at once.

`check_arguments` returns the config (`TrainConfig()` when none is given), the device the
simulation runs on and every problem as a `SettingProblem` naming its argument: the
numbers' ranges (`world_size`, `steps`, `seq_len`: ints, NumPy's and 0-dim torch
integers included, `workbench.inputs.is_int`), the choices (`optimizer_impl`,
`device`), the callables (`progress`, `loss_fn`), the settings a dry run cannot represent
(DeepSpeed's ZeRO stages and 16-bit modes, offload, DeepSpeed-only optimizers: their
buffers live in DeepSpeed's own C++/CUDA code) and, under FSDP, a process group that
already exists in the process.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config import (
    SESSION_OPTIMIZERS,
    Engine,
    FsdpMode,
    OffloadDevice,
    OptimizerName,
    TrainConfig,
)
from workbench.engines import engine_for, engine_problems
from workbench.inputs import is_int
from workbench.problems import SettingProblem
from workbench.train.dry_run.fsdp import group_problem

#: The optimizer implementations a dry run steps with ("foreach": torch's default on CUDA).
OPTIMIZER_IMPLS = ("foreach", "for-loop", "fused")
MAX_STEPS = 100
MAX_WORLD_SIZE = 65536


def check_arguments(
    config: Any,
    world_size: Any,
    steps: Any,
    impl: Any,
    seq_len: Any,
    device: Any,
    progress: Any,
    loss_fn: Any,
) -> tuple[TrainConfig, torch.device, list[SettingProblem]]:
    """The config, the simulated device and every problem of the arguments at once."""
    p: list[SettingProblem] = []
    if config is None:
        config = TrainConfig()
    elif not isinstance(config, TrainConfig):
        p.append(SettingProblem("config", type(config).__name__, "must be a workbench.TrainConfig"))
        config = TrainConfig()
    if not is_int(world_size) or not 1 <= world_size <= MAX_WORLD_SIZE:
        p.append(
            SettingProblem(
                "world_size",
                world_size,
                f"must be a whole number of ranks from 1 to {MAX_WORLD_SIZE} (the fake process "
                "group stands in for them)",
            )
        )
    if not is_int(steps) or not 2 <= steps <= MAX_STEPS:
        p.append(
            SettingProblem(
                "steps",
                steps,
                f"must be a whole number from 2 to {MAX_STEPS} (the first step creates the "
                "optimizer states; the peak is measured on the later ones)",
            )
        )
    if impl not in OPTIMIZER_IMPLS:
        p.append(
            SettingProblem("optimizer_impl", impl, f"must be one of {', '.join(OPTIMIZER_IMPLS)}")
        )
    if seq_len is not None and (not is_int(seq_len) or not 1 <= seq_len <= 1 << 22):
        p.append(
            SettingProblem("seq_len", seq_len, "must be None or a whole number from 1 to 2^22")
        )
    if progress is not None and not isinstance(progress, bool) and not callable(progress):
        p.append(
            SettingProblem(
                "progress", progress, "must be None, True, False or a function(phase, step, steps)"
            )
        )
    if loss_fn is not None and not callable(loss_fn):
        p.append(SettingProblem("loss_fn", loss_fn, "must be a function(outputs, targets)"))
    sim = _device(p, device)
    p += _setting_problems(config, world_size)
    ranked = is_int(world_size) and 1 <= world_size <= MAX_WORLD_SIZE
    if device == "auto" and ranked and engine_for(config, world_size) is Engine.DEEPSPEED:
        # DeepSpeed's engine on fake tensors is verified with its CPU accelerator (fake CPU
        # tensors running the GPU's kernels); device="cuda" asks for its CUDA path
        sim = torch.device("cpu")
    if ranked and engine_for(config, world_size) is not Engine.PLAIN:
        problem = group_problem(world_size)
        if problem is not None:
            p.append(problem)
    return config, sim, p


def _device(p: list[SettingProblem], device: Any) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        p.append(
            SettingProblem(
                "device",
                device,
                "this torch has no CUDA device; faking CUDA tensors through autograd needs one "
                "(use 'auto' or 'cpu')",
            )
        )
    elif device not in ("cpu", "cuda"):
        p.append(SettingProblem("device", device, "must be 'auto', 'cuda' or 'cpu'"))
    return torch.device(device if device in ("cpu", "cuda") else "cpu")


def _setting_problems(config: TrainConfig, world_size: Any) -> list[SettingProblem]:
    """The settings a dry run cannot represent, each with what to do instead."""
    p: list[SettingProblem] = []
    ranks = world_size if is_int(world_size) and world_size >= 1 else 1
    p += engine_problems(config, ranks)  # what the engine refuses (amp-fp16 on DeepSpeed, ...)
    for name in ("offload_optimizer", "offload_params"):
        if OffloadDevice(getattr(config, name)) is not OffloadDevice.NONE:
            p.append(
                SettingProblem(
                    name,
                    OffloadDevice(getattr(config, name)).value,
                    "offload cannot be simulated: host and device memory are one fake device "
                    "here, and DeepSpeed's CPU optimizer is a C++ kernel fake tensors cannot "
                    "run; the formula counts it (workbench.predict_memory)",
                )
            )
    if int(config.lora_rank) > 0 and config.qlora and FsdpMode(config.fsdp) is not FsdpMode.OFF:
        p.append(
            SettingProblem(
                "qlora",
                True,
                "QLoRA under FSDP (torchao's NF4 tensor, gathered through its own FSDP2 hooks) "
                "is not simulated on fake tensors over the fake process group (the plain "
                "loop's 4-bit base is); the formula counts it layer by layer "
                "(workbench.predict_memory), and a Session on 2+ ranks measures it",
            )
        )
    for name in ("tp", "pp"):
        if int(getattr(config, name)) > 1:
            p.append(
                SettingProblem(
                    name,
                    int(getattr(config, name)),
                    "the dry run simulates one rank of the plain loop, DeepSpeed or FSDP; "
                    "tensor and pipeline parallelism are not simulated yet: the formula "
                    "counts each rank's share (workbench.predict_memory), and `workbench "
                    f"launch --{name}` measures it",
                )
            )
    optimizer = OptimizerName(config.optimizer)
    if optimizer.row.dry_run_reason:  # its row says why fake tensors cannot step it
        p.append(SettingProblem("optimizer", optimizer.value, optimizer.row.dry_run_reason))
    elif optimizer not in SESSION_OPTIMIZERS:
        p.append(
            SettingProblem(
                "optimizer",
                optimizer.value,
                "is a DeepSpeed or bitsandbytes optimizer, whose kernels fake tensors cannot "
                f"run; a dry run steps {', '.join(o.value for o in SESSION_OPTIMIZERS)}",
            )
        )
    return p


__all__ = ["MAX_STEPS", "MAX_WORLD_SIZE", "OPTIMIZER_IMPLS", "check_arguments"]
