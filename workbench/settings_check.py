"""The checks of a TrainConfig that read several settings at once, and what this machine
cannot run of a valid one.

`workbench.config.TrainConfig.setting_problems()` checks each field on its own from its
`Setting`, then calls `combination_problems(config, ok)` for every combination whose fields
are themselves valid (`ok(*names)`); `runtime_problems(config)` answers what a workbench
Session on this machine cannot run of it (both it and `plain_value` are re-exported by
`workbench.config`). Below config.py: reads a config's attributes and imports only the
choices and `SettingProblem`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import Enum
from typing import Any

from workbench.choices import (
    NOT_IN_SESSION,
    PP_NOT_DEEPSPEED,
    SESSION_OPTIMIZERS,
    TP_NOT_DEEPSPEED,
    FsdpMode,
    LoraDtype,
    OffloadDevice,
    OptimizerName,
    Precision,
    bf16_true_problem,
)
from workbench.problems import SettingProblem


def plain_value(v: Any) -> Any:
    """A setting's value as plain data: an enum member as its string."""
    return v.value if isinstance(v, Enum) else v


def combination_problems(config: Any, ok: Callable[..., bool]) -> list[SettingProblem]:
    """The problems of `config`'s combinations of settings, in order; each is checked when
    the fields it reads are valid on their own (`ok(*names)`)."""
    p: list[SettingProblem] = []

    def add(name: str, value: Any, message: str) -> None:
        p.append(SettingProblem(name, value, message))

    # Combinations: each is checked when the fields it reads are valid on their own.
    if ok("optimizer_in_backward") and config.optimizer_in_backward is True:
        for name, bad_value, why in (
            ("grad_accum", ok("grad_accum") and config.grad_accum != 1, "grad_accum=1"),
            ("clip_grad_norm", config.clip_grad_norm is not None, "clip_grad_norm=None"),
            (
                "precision",
                ok("precision") and Precision(config.precision) is Precision.AMP_FP16,
                "a precision without loss scaling (fp32, amp-bf16, bf16-true)",
            ),
            (
                "zero_stage",
                ok("zero_stage", "precision", "fsdp")
                and (config.uses_deepspeed or FsdpMode(config.fsdp) is not FsdpMode.OFF),
                "the plain loop (zero_stage=0, no fsdp, a torch precision)",
            ),
        ):
            if bad_value:
                add(
                    "optimizer_in_backward",
                    True,
                    f"steps each parameter inside backward and frees its gradient, so "
                    f"nothing is left to accumulate, clip, unscale or shard: needs {why} "
                    f"(`{name}` says otherwise)",
                )
    if ok("optimizer"):  # what its row says it cannot step in backward or train on
        optimizer = OptimizerName(config.optimizer)
        r = optimizer.row
        if (
            ok("optimizer_in_backward")
            and r.in_backward_reason
            and config.optimizer_in_backward is True
        ):
            add("optimizer", optimizer.value, r.in_backward_reason)
        if (
            r.in_session
            and ok("zero_stage", "precision", "fsdp")
            and (
                ("deepspeed" not in r.engines and config.uses_deepspeed)
                or ("fsdp" not in r.engines and FsdpMode(config.fsdp) is not FsdpMode.OFF)
            )
        ):
            add("optimizer", optimizer.value, r.engines_reason or "")
    if ok("tp", "zero_stage", "precision") and config.tp > 1 and config.uses_deepspeed:
        add("tp", config.tp, TP_NOT_DEEPSPEED)
    if ok("sequence_parallel", "tp") and config.sequence_parallel is True and config.tp == 1:
        add(
            "sequence_parallel",
            True,
            "splits the tensor-parallel group's norms along the sequence: needs `tp` > 1",
        )
    if ok("pp", "zero_stage", "precision") and config.pp > 1 and config.uses_deepspeed:
        add("pp", config.pp, PP_NOT_DEEPSPEED)
    if ok("pp", "grad_accum") and config.pp > 1 and config.grad_accum < config.pp:
        add(
            "grad_accum",
            config.grad_accum,
            f"the micro-batches of a step fill the pipeline: needs at least `pp`={config.pp} "
            "of them (the bubble shrinks as grad_accum grows)",
        )
    if ok("pp", "fsdp") and config.pp > 1 and FsdpMode(config.fsdp) is not FsdpMode.OFF:
        add(
            "pp",
            config.pp,
            "pipeline stages train with plain data parallel over the other ranks, not "
            "FSDP: use `fsdp`='off' with `pp` > 1",
        )
    if ok("qlora", "lora_rank") and config.qlora is True and config.lora_rank == 0:
        add("qlora", True, "trains LoRA adapters over a 4-bit base: needs lora_rank >= 1")
    if (
        ok("lora_dtype", "precision")
        and LoraDtype(config.lora_dtype) is LoraDtype.FP32
        and Precision(config.precision).is_deepspeed
    ):
        add(
            "lora_dtype",
            "fp32",
            f"fp32 adapters over a bf16 base: `precision`={Precision(config.precision).value} "
            "is DeepSpeed's 16-bit mode, whose engine casts every weight, the adapters' too, "
            "to its dtype; use 'auto'",
        )
    if (
        ok("optimizer", "zero_stage")
        and OptimizerName(config.optimizer).is_onebit
        and config.zero_stage != 0
    ):
        optimizer = OptimizerName(config.optimizer)
        add(
            "optimizer",
            optimizer.value,
            "DeepSpeed's 1-bit optimizers do not run with ZeRO; needs `zero_stage`=0 "
            f"(`zero_stage`={config.zero_stage})",
        )
    fsdp = FsdpMode(config.fsdp) if ok("fsdp") else None
    offload_opt = OffloadDevice(config.offload_optimizer) if ok("offload_optimizer") else None
    offload_par = OffloadDevice(config.offload_params) if ok("offload_params") else None
    precision = Precision(config.precision) if ok("precision") else None
    stage = config.zero_stage if ok("zero_stage") else None
    if fsdp is not None and fsdp is not FsdpMode.OFF:
        if stage is not None and stage != 0:
            add(
                "fsdp",
                fsdp.value,
                "PyTorch FSDP and DeepSpeed ZeRO are two sharding engines; use one "
                f"(`zero_stage`={stage} needs `fsdp`='off', `fsdp` needs `zero_stage`=0)",
            )
        if precision is not None and precision.is_deepspeed:
            add(
                "fsdp",
                fsdp.value,
                f"`precision`={precision.value!r} is DeepSpeed's 16-bit mode; with FSDP use "
                "'amp-bf16' or 'amp-fp16' (FSDP's mixed precision)",
            )
        if offload_opt is not None and offload_opt is not OffloadDevice.NONE:
            add(
                "offload_optimizer",
                offload_opt.value,
                "a DeepSpeed (ZeRO-Offload) setting; FSDP offloads parameters, gradients "
                "and optimizer states together with `offload_params`='cpu'",
            )
        if offload_par is not None and (
            offload_par is OffloadDevice.NVME
            or (offload_par is OffloadDevice.CPU and fsdp is not FsdpMode.FULL_SHARD)
        ):
            add(
                "offload_params",
                offload_par.value,
                f"FSDP offloads to 'cpu' with `fsdp`='full_shard' (`fsdp`={fsdp.value!r})",
            )
    if (
        stage == 0
        and offload_opt is not None
        and offload_opt is not OffloadDevice.NONE
        and fsdp is FsdpMode.OFF
    ):
        add(
            "offload_optimizer",
            offload_opt.value,
            "needs zero_stage 1, 2 or 3 (`zero_stage`=0)",
        )
    if (
        stage is not None
        and offload_par is not None
        and offload_par is not OffloadDevice.NONE
        and stage != 3
        and fsdp is FsdpMode.OFF
    ):
        add(
            "offload_params",
            offload_par.value,
            f"parameter offload needs `zero_stage`=3 (`zero_stage`={stage})",
        )
    if precision is Precision.BF16_TRUE and stage is not None and stage >= 1:
        p.append(bf16_true_problem(f"`zero_stage`={stage}"))
    # DeepSpeed's own 16-bit modes (fp16/bf16) with zero_stage=0 are allowed: the
    # Session routes them through the DeepSpeed engine, which supports stage 0.
    uses_nvme = OffloadDevice.NVME in (offload_opt, offload_par)
    if uses_nvme and ok("nvme_path") and not config.nvme_path:
        add("nvme_path", None, "NVMe offload needs nvme_path, a writable directory")
    # Whether nvme_path exists is a question about the machine: runtime_problems().
    if ok("warmup_steps", "total_steps") and config.warmup_steps > config.total_steps:
        add(
            "warmup_steps",
            config.warmup_steps,
            f"must not exceed `total_steps`={config.total_steps}",
        )
    return p


def runtime_problems(config: Any) -> list[SettingProblem]:
    """What a workbench Session on this machine cannot run of a valid `config`, as
    `SettingProblem`s (empty when it can; `str()` of each is its line): an optimizer the
    Session does not train, with why and the nearest one it does; an NVMe offload directory
    that does not exist here or is not writable. `TrainConfig.setting_problems()` checks the
    config itself; this checks the machine."""
    p: list[SettingProblem] = []
    optimizer = OptimizerName(config.optimizer)
    if optimizer not in SESSION_OPTIMIZERS:
        why, nearest = NOT_IN_SESSION[optimizer]
        p.append(
            SettingProblem(
                "optimizer",
                optimizer.value,
                f"cannot train here: {why}; the nearest a Session trains is "
                f"`optimizer`={nearest.value!r} (a Session trains "
                f"{', '.join(o.value for o in SESSION_OPTIMIZERS)})",
            )
        )
    uses_nvme = OffloadDevice.NVME in (
        OffloadDevice(config.offload_optimizer),
        OffloadDevice(config.offload_params),
    )
    path = config.nvme_path
    if uses_nvme and path and not (os.path.isdir(path) and os.access(path, os.W_OK)):
        p.append(
            SettingProblem(
                "nvme_path", path, "must be an existing writable directory on this machine"
            )
        )
    return p


#: LoRA's `lora_targets`: "all-linear", or comma-separated module names or name endings.
LORA_TARGETS_TEXT = (
    '"all-linear" or comma-separated module names or name endings made of letters, digits, '
    '"_" and "." (e.g. "qkv,proj"), at most 1000 characters'
)


def lora_target_names(text: str) -> list[str]:
    """`lora_targets` as its list of names (["all-linear"] for every linear layer)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def lora_targets_ok(v: Any) -> bool:
    if not isinstance(v, str) or len(v) > 1000:
        return False
    names = lora_target_names(v)
    return bool(names) and all(
        name == "all-linear" or all(c.isalnum() or c in "_." for c in name) for name in names
    )
