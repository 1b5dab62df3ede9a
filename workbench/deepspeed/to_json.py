"""TrainConfig -> DeepSpeed JSON: `to_deepspeed(config, world_size)` builds the dict
`deepspeed.initialize` accepts; the DeepSpeed backend trains with exactly this dict, so
what is exported is what ran. Pure.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.config import (
    ConfigError,
    LRSchedule,
    OffloadDevice,
    OptimizerName,
    Precision,
    SettingProblem,
    TrainConfig,
)
from workbench.deepspeed.keys import (
    ADAM_BETAS,
    ADAM_EPS,
    DS_SCALE_FACTOR,
    TYPE_OF_OPTIMIZER,
    ZERO_TESTED_OPTIMIZERS,
)
from workbench.engines import bf16_true_problem


def to_deepspeed(config: TrainConfig, world_size: int = 1) -> dict[str, Any]:
    """The DeepSpeed config dict for `config` on `world_size` data-parallel ranks.

    Raises ValueError for settings DeepSpeed cannot express (fp16 growth/backoff factors
    other than 2 and 0.5, a loss_scale_init that is not a power of two, the adam8bit
    optimizer (torchao's, not DeepSpeed's), pure bf16 "bf16-true": DeepSpeed's bf16 keeps an fp32 master
    copy, `optimizer_in_backward` and `qlora`, which only the plain loop trains). An optimizer ZeRO has not been tested with (SGD, Lamb) gets
    `"zero_allow_untested_optimizer": true` at stages 1-3, which DeepSpeed requires.
    """
    if not isinstance(config, TrainConfig):
        raise ConfigError([SettingProblem("config", config, "must be a TrainConfig")])
    if str(config.fsdp) != "off":
        raise ConfigError(
            [
                SettingProblem(
                    "fsdp",
                    str(config.fsdp),
                    "a PyTorch FSDP setting has no DeepSpeed config; export it with workbench "
                    "export --format fsdp (or set `fsdp`='off' and a zero_stage)",
                )
            ]
        )
    batch = config.effective_batch_size(world_size)  # validates world_size
    # settings a DeepSpeed config cannot hold: refused, not dropped from the dict
    unexpressed = [
        SettingProblem(name, True, why)
        for name, why in (
            ("optimizer_in_backward", "DeepSpeed steps its optimizer after backward; a "
             "Session's plain loop trains it"),
            ("qlora", "DeepSpeed's engine does not train LoRA over a 4-bit bitsandbytes "
             "base; a Session's plain loop trains it"),
        )
        if getattr(config, name) is True
    ]  # fmt: skip
    if unexpressed:
        raise ConfigError(unexpressed)
    precision = Precision(config.precision)
    if precision is Precision.BF16_TRUE:  # DeepSpeed's bf16 always has an fp32 master copy
        raise ConfigError([bf16_true_problem()])
    ds: dict[str, Any] = {
        "train_batch_size": batch,
        "train_micro_batch_size_per_gpu": int(config.micro_batch),
        "gradient_accumulation_steps": int(config.grad_accum),
        "optimizer": _optimizer_block(config),
    }
    scheduler = _scheduler_block(config)
    if scheduler is not None:
        ds["scheduler"] = scheduler
    # Always written: DeepSpeed clips at 1.0 when the key is absent (its default), so "no
    # clipping" must be an explicit 0.0.
    ds["gradient_clipping"] = (
        float(config.clip_grad_norm) if config.clip_grad_norm is not None else 0.0
    )
    if precision is Precision.FP16:
        ds["fp16"] = _fp16_block(config)
    elif precision is Precision.BF16:
        ds["bf16"] = {"enabled": True}
    elif precision in (Precision.AMP_BF16, Precision.AMP_FP16):
        dtype = "bfloat16" if precision is Precision.AMP_BF16 else "float16"
        ds["torch_autocast"] = {"enabled": True, "dtype": dtype}
    zero: dict[str, Any] = {"stage": int(config.zero_stage)}
    for key, value in (
        ("offload_optimizer", OffloadDevice(config.offload_optimizer)),
        ("offload_param", OffloadDevice(config.offload_params)),
    ):
        if value is OffloadDevice.NONE:
            continue
        block: dict[str, Any] = {"device": value.value}
        if value is OffloadDevice.NVME:
            block["nvme_path"] = config.nvme_path
        zero[key] = block
    ds["zero_optimization"] = zero
    if config.zero_stage >= 1 and OptimizerName(config.optimizer) not in ZERO_TESTED_OPTIMIZERS:
        ds["zero_allow_untested_optimizer"] = True
    return ds


def _optimizer_block(config: TrainConfig) -> dict[str, Any]:
    name = OptimizerName(config.optimizer)
    lr = float(config.lr)
    wd = float(config.weight_decay)
    if name in (OptimizerName.ADAMW, OptimizerName.ADAM):
        params: dict[str, Any] = {
            "lr": lr,
            "betas": list(ADAM_BETAS),
            "eps": ADAM_EPS,
            "weight_decay": wd,
            # torch's Adam inside DeepSpeed: no FusedAdam (CUDA) or DeepSpeedCPUAdam (CPU
            # offload) JIT build, which needs nvcc / the CUDA headers matching torch's
            "torch_adam": True,
        }
        if name is OptimizerName.ADAM:
            # DeepSpeed's "Adam" means AdamW unless adam_w_mode is false.
            params["adam_w_mode"] = False
            return {"type": "Adam", "params": params}
        return {"type": "AdamW", "params": params}
    r = name.row
    if r.deepspeed_name == "SGD":  # torch's SGD, which DeepSpeed looks up in torch.optim: the
        # keywords a Session builds it with (its row's)
        params = {
            key: float(source[1:]) if source.startswith("=") else float(getattr(config, source))
            for key, source in r.factory_kwargs
        }
        return {"type": "SGD", "params": params}
    if name in TYPE_OF_OPTIMIZER:  # DeepSpeed's own: its defaults for everything else
        return {"type": TYPE_OF_OPTIMIZER[name], "params": {"lr": lr, "weight_decay": wd}}
    allowed = ", ".join(o.value for o in OptimizerName if o in TYPE_OF_OPTIMIZER)
    raise ConfigError(
        [
            SettingProblem(
                "optimizer", name.value, f"not expressible in DeepSpeed JSON; allowed: {allowed}"
            )
        ]
    )


def _scheduler_block(config: TrainConfig) -> dict[str, Any] | None:
    schedule = LRSchedule(config.lr_schedule)
    lr = float(config.lr)
    warmup = int(config.warmup_steps)
    total = int(config.total_steps)
    if schedule is LRSchedule.CONSTANT:
        if warmup == 0:
            return None
        return {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": lr,
                "warmup_num_steps": warmup,
                "warmup_type": "linear",
            },
        }
    if schedule is LRSchedule.COSINE:
        # DeepSpeed needs warmup_num_steps >= 1: no warmup is a warmup that starts at 1.0
        return {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": total,
                "warmup_num_steps": max(1, warmup),
                "warmup_min_ratio": 0.0 if warmup else 1.0,
                "cos_min_ratio": 0.0,
                "warmup_type": "linear",
            },
        }
    # one-cycle: rise from lr/25 to lr over the warmup (or the first 30% of the horizon),
    # then fall back over the rest.
    first = warmup if warmup > 0 else max(1, round(0.3 * total))
    second = max(1, total - first)
    return {
        "type": "OneCycle",
        "params": {
            "cycle_min_lr": lr / 25.0,
            "cycle_max_lr": lr,
            "cycle_first_step_size": first,
            "cycle_second_step_size": second,
            "decay_step_size": 0,
            "cycle_momentum": False,
        },
    }


def _fp16_block(config: TrainConfig) -> dict[str, Any]:
    init = float(config.loss_scale_init)
    power = math.log2(init)
    if power != int(power):
        raise ConfigError(
            [
                SettingProblem(
                    "loss_scale_init",
                    init,
                    "DeepSpeed fp16 needs a power of two (initial_scale_power)",
                )
            ]
        )
    if float(config.loss_scale_growth) != DS_SCALE_FACTOR:
        raise ConfigError(
            [
                SettingProblem(
                    "loss_scale_growth",
                    config.loss_scale_growth,
                    f"DeepSpeed fp16 grows the scale by {DS_SCALE_FACTOR} only; allowed: "
                    f"{DS_SCALE_FACTOR}",
                )
            ]
        )
    if float(config.loss_scale_backoff) != 1.0 / DS_SCALE_FACTOR:
        raise ConfigError(
            [
                SettingProblem(
                    "loss_scale_backoff",
                    config.loss_scale_backoff,
                    f"DeepSpeed fp16 backs off by {1.0 / DS_SCALE_FACTOR} only; allowed: "
                    f"{1.0 / DS_SCALE_FACTOR}",
                )
            ]
        )
    return {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": int(power),
        "loss_scale_window": int(config.loss_scale_interval),
        "hysteresis": 1,  # back off on every overflow, like torch's GradScaler
        "min_loss_scale": 1,
    }
