"""DeepSpeed JSON -> TrainConfig, by one rule, DeepSpeed's own.

`import_deepspeed(source)` reads a DeepSpeed config into a `TrainConfig`, checked with
DeepSpeed's code (`workbench.deepspeed.check`, which imports DeepSpeed on first use): a
config DeepSpeed accepts imports; a key or value DeepSpeed rejects is an error with
DeepSpeed's reason; every key DeepSpeed reads that the workbench does not model (and every
value it models only approximately) is named in one grouped warning and ignored. `"auto"`
values (Hugging Face Trainer configs) are filled from `base`, the session's own settings
(default `TrainConfig()`), and a second warning says what was chosen. The warnings come
back next to the config so a UI can show them; `from_deepspeed(source)` is the same but
issues them with `warnings.warn`.

Batch sizes, DeepSpeed's way (`DeepSpeedConfig._set_batch_related_parameters`):
``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world``.
With all three given the world size is inferred (and must equal `world_size=` if that is
passed too); otherwise the missing ones are solved for `world_size` (default 1): only
``train_batch_size`` means accumulation 1, only the micro-batch means accumulation 1,
``train_batch_size=1024, gradient_accumulation_steps=8`` gives micro 128 on one rank and
64 with ``world_size=2``. A combination that does not divide is an error naming the keys.

Not expressible in DeepSpeed JSON (taken from `base` on import): seed, device,
num_workers, pin_memory, lr_scaling, activation_checkpointing, checkpoint settings, the
schedule horizon when no scheduler gives one, and the optimizer when the config has none.

The blocks (`zero_optimization`, precision, optimizer, scheduler) are read in `blocks`,
the shape of the config is checked in `reader`.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from typing import Any

from workbench.config import (
    ConfigError,
    LRSchedule,
    OffloadDevice,
    OptimizerName,
    Precision,
    TrainConfig,
)
from workbench.deepspeed.blocks import (
    deepspeed_precision,
    read_optimizer,
    read_precision,
    read_scheduler,
    read_zero,
)
from workbench.deepspeed.check import (
    check_config,
    close_key,
    coercion_problems,
    deepspeed_name,
    top_level_keys,
)
from workbench.deepspeed.keys import (
    ADAM_BETAS,
    ADAM_EPS,
    BATCH_KEYS,
    DEEPSPEED_DEFAULT_CLIPPING,
    MODELLED_TOP_LEVEL,
    TYPE_OF_OPTIMIZER,
    DeepSpeedImport,
)
from workbench.deepspeed.problems import (
    DeepSpeedConfigError,
    KeyProblem,
    MappedConfigError,
    keyed,
    unique,
)
from workbench.deepspeed.reader import Reader, cleaned, load_config, too_deep
from workbench.inputs import shown


def import_deepspeed(
    source: dict[str, Any] | str | os.PathLike[str],
    *,
    world_size: int | None = None,
    base: TrainConfig | None = None,
) -> DeepSpeedImport:
    """Read a DeepSpeed config (dict or JSON path) into a TrainConfig plus warnings.

    `base` (default `TrainConfig()`): the session's settings, which fill `"auto"` values
    and the fields DeepSpeed JSON cannot express. Every error is reported at once in one
    `DeepSpeedConfigError` (a ValueError), each a `KeyProblem` naming the key path, the
    value and the reason (DeepSpeed's own where DeepSpeed rejects the key).
    """
    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise ValueError(f"world_size={shown(world_size)}: must be an integer >= 1 or None")
    if base is None:
        base = TrainConfig()
    elif not isinstance(base, TrainConfig):
        raise ValueError(f"base={shown(base)}: must be a TrainConfig or None")
    raw = load_config(source)
    deep = too_deep(raw)
    if deep is not None:
        raise DeepSpeedConfigError([deep])
    raw, shape, dropped = cleaned(raw)
    r = Reader()
    ds = _fill_auto(r, raw, base)
    read_keys = top_level_keys()
    for key in ds:
        if key in MODELLED_TOP_LEVEL:
            continue
        if key in read_keys:
            r.ignore(key)
        else:
            r.unread.append(key + close_key(key, read_keys))

    # Settings DeepSpeed JSON cannot express come from the session; the ones it can take
    # DeepSpeed's meaning when absent (no scheduler: constant lr; no clipping; fp32; ZeRO 0).
    kw: dict[str, Any] = base.to_dict()
    kw.update(
        lr_schedule=LRSchedule.CONSTANT.value,
        warmup_steps=0,
        clip_grad_norm=None,
        precision=Precision.FP32.value,
        zero_stage=0,
        offload_optimizer=OffloadDevice.NONE.value,
        offload_params=OffloadDevice.NONE.value,
    )

    tbs = r.integer(ds, "train_batch_size", "train_batch_size", 1)
    micro = r.integer(ds, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", 1)
    accum = r.integer(ds, "gradient_accumulation_steps", "gradient_accumulation_steps", 1)
    world = _solve_batch(r, ds, tbs, micro, accum, world_size, kw)

    problems, parsed = check_config(ds, batch_keys=BATCH_KEYS)
    r.errors.extend(problems)
    r.errors.extend(coercion_problems(ds))
    autocast = ds.get("torch_autocast")
    if isinstance(autocast, dict) and "enabled" in autocast:
        r.boolean(autocast, "enabled", "torch_autocast.enabled")
    if "zero_allow_untested_optimizer" in ds:
        r.boolean(ds, "zero_allow_untested_optimizer", "zero_allow_untested_optimizer")
    if parsed is not None:
        read_zero(r, ds.get("zero_optimization"), parsed, kw)
        read_precision(r, ds, parsed, kw, base)

    clip = r.number(ds, "gradient_clipping", "gradient_clipping")
    if clip is None and "gradient_clipping" not in ds:
        clip = DEEPSPEED_DEFAULT_CLIPPING  # absent: DeepSpeed clips at its default
    if clip is not None and clip > 0:  # 0 = off in DeepSpeed
        kw["clip_grad_norm"] = clip

    opt = r.block(ds, "optimizer", "optimizer")
    if opt is not None:
        read_optimizer(r, opt, kw, ds)
    sched = r.block(ds, "scheduler", "scheduler")
    if sched is not None:
        read_scheduler(r, sched, kw)

    if shape:  # the problems of what was left out come first; none that follow from it
        r.errors = shape + [e for e in r.errors if not any(p and p in str(e) for p in dropped)]
    if r.errors:
        raise DeepSpeedConfigError(unique(r.errors))
    try:
        config = TrainConfig(**kw)
    except ConfigError as exc:
        raise MappedConfigError(exc, _ds_keys_of(exc), _DS_KEY_OF_FIELD) from None
    return DeepSpeedImport(
        config=config,
        world_size=world,
        warnings=r.warnings(deepspeed_name()),
        auto_keys=tuple(sorted(r.auto_paths)),
    )


def from_deepspeed(
    source: dict[str, Any] | str | os.PathLike[str],
    *,
    world_size: int | None = None,
    base: TrainConfig | None = None,
) -> TrainConfig:
    """`import_deepspeed(...)`, issuing each warning with `warnings.warn`."""
    result = import_deepspeed(source, world_size=world_size, base=base)
    for message in result.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    return result.config


# ---- "auto" (Hugging Face Trainer configs)
def _auto_fills(base: TrainConfig) -> dict[str, tuple[Any, str]]:
    """Key path -> (value, the session setting it comes from) for the "auto" values the
    workbench fills; the Hugging Face Trainer fills the same keys from its arguments."""
    precision, source = deepspeed_precision(Precision(base.precision))  # bf16-true: bf16
    optimizer = OptimizerName(base.optimizer)
    fills: dict[str, tuple[Any, str]] = {
        "train_micro_batch_size_per_gpu": (int(base.micro_batch), "micro_batch"),
        "gradient_accumulation_steps": (int(base.grad_accum), "grad_accum"),
        "gradient_clipping": (float(base.clip_grad_norm or 0.0), "clip_grad_norm"),
        "optimizer.params.lr": (float(base.lr), "lr"),
        "optimizer.params.weight_decay": (float(base.weight_decay), "weight_decay"),
        "optimizer.params.betas": (list(ADAM_BETAS), "the workbench's betas"),
        "optimizer.params.eps": (ADAM_EPS, "the workbench's eps"),
        "optimizer.params.momentum": (float(base.momentum), "momentum"),
        "scheduler.params.warmup_min_lr": (0.0, "the workbench warms up from 0"),
        "scheduler.params.warmup_max_lr": (float(base.lr), "lr"),
        "scheduler.params.warmup_num_steps": (int(base.warmup_steps), "warmup_steps"),
        "scheduler.params.total_num_steps": (int(base.total_steps), "total_steps"),
        "scheduler.params.cycle_max_lr": (float(base.lr), "lr"),
        "scheduler.params.cycle_min_lr": (float(base.lr) / 25.0, "lr / 25"),
        "fp16.enabled": (precision is Precision.FP16, source),
        "bf16.enabled": (precision is Precision.BF16, source),
        "bfloat16.enabled": (precision is Precision.BF16, source),
        "torch_autocast.enabled": (
            precision in (Precision.AMP_BF16, Precision.AMP_FP16),
            source,
        ),
        "torch_autocast.dtype": (
            "float16" if precision is Precision.AMP_FP16 else "bfloat16",
            source,
        ),
        "fp16.loss_scale_window": (int(base.loss_scale_interval), "loss_scale_interval"),
        "zero_optimization.stage": (int(base.zero_stage), "zero_stage"),
        "zero_optimization.offload_optimizer.device": (
            OffloadDevice(base.offload_optimizer).value,
            "offload_optimizer",
        ),
        "zero_optimization.offload_param.device": (
            OffloadDevice(base.offload_params).value,
            "offload_params",
        ),
    }
    power = math.log2(float(base.loss_scale_init))
    if power == int(power):
        fills["fp16.initial_scale_power"] = (int(power), "loss_scale_init")
    if base.nvme_path:
        for key in ("offload_optimizer", "offload_param"):
            fills[f"zero_optimization.{key}.nvme_path"] = (base.nvme_path, "nvme_path")
    if optimizer in TYPE_OF_OPTIMIZER:
        fills["optimizer.type"] = (TYPE_OF_OPTIMIZER[optimizer], "optimizer")
    return fills


def _fill_auto(r: Reader, raw: dict[str, Any], base: TrainConfig) -> dict[str, Any]:
    """A copy of `raw` with every "auto" value filled from `base` or, inside a block,
    removed so DeepSpeed's default applies (as DeepSpeed's own config models do)."""
    import copy

    fills = _auto_fills(base)
    ds = copy.deepcopy(raw)

    def walk(block: dict[str, Any], prefix: str) -> None:
        for key in list(block):
            path = f"{prefix}.{key}" if prefix else key
            value = block[key]
            if isinstance(value, dict):
                walk(value, path)
                continue
            if value != "auto":
                continue
            r.auto_paths.add(path)
            if path == "train_batch_size":
                del block[key]  # DeepSpeed derives it: micro x accumulation x world size
                r.filled.append("train_batch_size (micro_batch x grad_accum x world size)")
            elif path in fills:
                block[key], source = fills[path]
                r.filled.append(f"{path}={shown(block[key])} ({source})")
            elif prefix:
                del block[key]
                r.defaulted.append(path)
            else:
                r.errors.append(
                    KeyProblem(
                        path,
                        value,
                        "no session setting fills it, and DeepSpeed needs a value for a "
                        "top-level key",
                    )
                )

    walk(ds, "")
    return ds


# ---- batch sizes
def _solve_batch(
    r: Reader,
    ds: dict[str, Any],
    tbs: int | None,
    micro: int | None,
    accum: int | None,
    world_size: int | None,
    kw: dict[str, Any],
) -> int:
    present = [k for k in BATCH_KEYS if k in ds]
    if r.errors and any(e.field in present for e in r.errors):
        return world_size or 1
    if tbs is None and micro is None:
        r.errors.append(
            keyed("train_batch_size / train_micro_batch_size_per_gpu", "at least one must be given")
        )
        return world_size or 1
    if tbs is not None and micro is not None and accum is not None:
        per_world = micro * accum
        if tbs % per_world:
            r.errors.append(
                KeyProblem(
                    "train_batch_size",
                    tbs,
                    f"must equal train_micro_batch_size_per_gpu ({micro}) x "
                    f"gradient_accumulation_steps ({accum}) x world size; {tbs} is not a "
                    f"multiple of {per_world}",
                    value_text=str(tbs),
                )
            )
            return world_size or 1
        world = tbs // per_world
        if world_size is not None and world != world_size:
            r.errors.append(
                KeyProblem(
                    "train_batch_size",
                    tbs,
                    f"with micro {micro} and accum {accum} implies world size {world}, but "
                    f"world_size={world_size}; must equal {micro * accum * world_size}",
                    value_text=str(tbs),
                )
            )
        kw.update(micro_batch=micro, grad_accum=accum)
        return world
    world = world_size or 1
    if tbs is None:
        kw.update(micro_batch=micro, grad_accum=accum or 1)
        return world
    if micro is None:
        accum = accum or 1
        denom = accum * world
        if tbs % denom:
            r.errors.append(
                KeyProblem(
                    "train_batch_size",
                    tbs,
                    f"must be a multiple of gradient_accumulation_steps ({accum}) x world size "
                    f"({world}) = {denom}",
                    value_text=str(tbs),
                )
            )
            return world
        kw.update(micro_batch=tbs // denom, grad_accum=accum)
        return world
    denom = micro * world
    if tbs % denom:
        r.errors.append(
            KeyProblem(
                "train_batch_size",
                tbs,
                f"must be a multiple of train_micro_batch_size_per_gpu ({micro}) x world size "
                f"({world}) = {denom}",
                value_text=str(tbs),
            )
        )
        return world
    kw.update(micro_batch=micro, grad_accum=tbs // denom)
    return world


#: TrainConfig field -> the DeepSpeed key(s) it is read from, to name them in errors.
_DS_KEY_OF_FIELD = {
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer": "zero_optimization.offload_optimizer.device",
    "offload_params": "zero_optimization.offload_param.device",
    "nvme_path": "zero_optimization.offload_optimizer/offload_param.nvme_path",
    "micro_batch": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
    "lr": "optimizer.params.lr",
    "weight_decay": "optimizer.params.weight_decay",
    "optimizer": "optimizer.type",
    "clip_grad_norm": "gradient_clipping",
    "precision": "fp16.enabled / bf16.enabled",
    "warmup_steps": "scheduler.params.warmup_num_steps",
    "total_steps": "scheduler.params.total_num_steps",
}


def _ds_keys_of(exc: ValueError) -> str:
    """' (DeepSpeed keys: ...)' for the TrainConfig fields a settings error names (each
    problem's field and the settings its message names with a value), or ''."""
    keys: list[str] = []
    problems = exc.problems if isinstance(exc, ConfigError) else []
    names = [n for p in problems for n in (p.field, *re.findall(r"`(\w+)`=", p.message))]
    for name in names:
        key = _DS_KEY_OF_FIELD.get(name)
        if key is not None and key not in keys:
            keys.append(key)
    return f" (DeepSpeed keys: {', '.join(keys)})" if keys else ""
