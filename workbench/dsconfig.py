"""TrainConfig <-> DeepSpeed JSON, both directions. Pure: imports no torch or deepspeed.

`to_deepspeed(config, world_size)` builds the dict `deepspeed.initialize` accepts; the
DeepSpeed backend trains with exactly this dict, so what is exported is what ran.
`import_deepspeed(source)` reads one back into a `TrainConfig`, validating key paths and
types, and returns the warnings (ignored keys, ignored values) next to the config so a UI
can show them; `from_deepspeed(source)` is the same but issues them with `warnings.warn`.

World size on import. DeepSpeed's batch keys satisfy
``train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * world``.
When all three are given, the world size is inferred (and must equal `world_size=` if that is
passed too). When one of micro/accum is missing, it is solved for with `world_size`
(default 1): e.g. ``train_batch_size=1024, gradient_accumulation_steps=8`` gives micro 128 on
one rank, micro 64 with ``world_size=2``. Any non-integer or inconsistent combination is an
error naming the keys and values.

Not expressible in DeepSpeed JSON (kept at TrainConfig defaults on import): seed, device,
num_workers, pin_memory, lr_scaling, activation_checkpointing, checkpoint settings.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

from workbench.config import (
    LRSchedule,
    OffloadDevice,
    OptimizerName,
    Precision,
    TrainConfig,
)

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# fp16: DeepSpeed's dynamic loss scaler grows and backs off by a factor of 2 only.
DS_SCALE_FACTOR = 2.0

# Keys DeepSpeed understands that workbench does not model: accepted, ignored, warned about.
IGNORED_TOP_LEVEL = frozenset(
    {
        "steps_per_print",
        "wall_clock_breakdown",
        "dump_state",
        "memory_breakdown",
        "prescale_gradients",
        "gradient_predivide_factor",
        "sparse_gradients",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "communication_data_type",
        "seq_parallel_communication_data_type",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "comms_logger",
        "flops_profiler",
        "timers",
        "checkpoint",
        "data_types",
        "activation_checkpointing",
        "elasticity",
        "aio",
        "load_universal_checkpoint",
        "use_node_local_storage",
        "dataloader_drop_last",
        "compile",
    }
)
IGNORED_ZERO = frozenset(
    {
        "contiguous_gradients",
        "overlap_comm",
        "reduce_scatter",
        "reduce_bucket_size",
        "allgather_partitions",
        "allgather_bucket_size",
        "use_multi_rank_bucket_allreduce",
        "round_robin_gradients",
        "sub_group_size",
        "elastic_checkpoint",
        "ignore_unused_parameters",
        "load_from_fp32_weights",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_model_persistence_threshold",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "zero_hpz_partition_size",
        "zero_quantized_weights",
        "zero_quantized_gradients",
        "memory_efficient_linear",
        "mics_shard_size",
        "log_trace_cache_warnings",
    }
)
IGNORED_OFFLOAD = frozenset(
    {
        "pin_memory",
        "buffer_count",
        "buffer_size",
        "max_in_cpu",
        "fast_init",
        "ratio",
        "pipeline_read",
        "pipeline_write",
    }
)
KNOWN_TOP_LEVEL = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "optimizer",
        "scheduler",
        "fp16",
        "bf16",
        "bfloat16",
        "torch_autocast",
        "zero_optimization",
        "gradient_clipping",
    }
)
KNOWN_ZERO = frozenset({"stage", "offload_optimizer", "offload_param"})
KNOWN_OFFLOAD = frozenset({"device", "nvme_path"})
KNOWN_FP16 = frozenset(
    {
        "enabled",
        "loss_scale",
        "initial_scale_power",
        "loss_scale_window",
        "hysteresis",
        "consecutive_hysteresis",
        "min_loss_scale",
        "auto_cast",
        "fp16_master_weights_and_grads",
    }
)
KNOWN_BF16 = frozenset(
    {
        "enabled",
        "immediate_grad_update",
        "check_grad_overflow",
        "bf16_master_weights_and_grads",
        "bf16_optimizer_states",
    }
)
KNOWN_AUTOCAST = frozenset({"enabled", "dtype", "lower_precision_safe_modules"})
KNOWN_OPTIMIZER_PARAMS = frozenset(
    {
        "lr",
        "betas",
        "eps",
        "weight_decay",
        "momentum",
        "adam_w_mode",
        "torch_adam",
        "dampening",
        "nesterov",
    }
)


@dataclass(frozen=True)
class DeepSpeedImport:
    """A DeepSpeed config read back: the TrainConfig, the world size the batch keys imply,
    and every warning (ignored keys/values), one line each."""

    config: TrainConfig
    world_size: int
    warnings: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- export
def to_deepspeed(config: TrainConfig, world_size: int = 1) -> dict[str, Any]:
    """The DeepSpeed config dict for `config` on `world_size` data-parallel ranks.

    Raises ValueError for settings DeepSpeed cannot express (fp16 growth/backoff factors
    other than 2 and 0.5, a loss_scale_init that is not a power of two, the estimator-only
    adam8bit optimizer).
    """
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={config!r}: must be a TrainConfig")
    batch = config.effective_batch_size(world_size)  # validates world_size
    precision = Precision(config.precision)
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
        }
        if name is OptimizerName.ADAM:
            # DeepSpeed's "Adam" means AdamW unless adam_w_mode is false.
            params["adam_w_mode"] = False
            return {"type": "Adam", "params": params}
        return {"type": "AdamW", "params": params}
    if name is OptimizerName.SGD:
        return {
            "type": "SGD",
            "params": {"lr": lr, "momentum": float(config.momentum), "weight_decay": wd},
        }
    if name is OptimizerName.SGD_NOMOMENTUM:
        return {"type": "SGD", "params": {"lr": lr, "momentum": 0.0, "weight_decay": wd}}
    raise ValueError(
        f"optimizer={name.value!r}: not expressible in DeepSpeed JSON; allowed: adamw, adam, sgd, "
        "sgd-nomomentum"
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
        return {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": total,
                "warmup_num_steps": warmup,
                "warmup_min_ratio": 0.0,
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
        raise ValueError(
            f"loss_scale_init={init!r}: DeepSpeed fp16 needs a power of two (initial_scale_power)"
        )
    if float(config.loss_scale_growth) != DS_SCALE_FACTOR:
        raise ValueError(
            f"loss_scale_growth={config.loss_scale_growth!r}: DeepSpeed fp16 grows the scale by "
            f"{DS_SCALE_FACTOR} only; allowed: {DS_SCALE_FACTOR}"
        )
    if float(config.loss_scale_backoff) != 1.0 / DS_SCALE_FACTOR:
        raise ValueError(
            f"loss_scale_backoff={config.loss_scale_backoff!r}: DeepSpeed fp16 backs off by "
            f"{1.0 / DS_SCALE_FACTOR} only; allowed: {1.0 / DS_SCALE_FACTOR}"
        )
    return {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": int(power),
        "loss_scale_window": int(config.loss_scale_interval),
        "hysteresis": 1,  # back off on every overflow, like torch's GradScaler
        "min_loss_scale": 1,
    }


# --------------------------------------------------------------------------- import
class _Reader:
    """Collects errors (key path, value, allowed) and warnings while reading a dict."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def block(self, parent: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
        if key not in parent:
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.errors.append(f"{path}={value!r}: must be a JSON object")
            return None
        return value

    def keys(
        self, block: dict[str, Any], path: str, known: frozenset[str], ignored: frozenset[str]
    ) -> None:
        for key in block:
            full = f"{path}.{key}" if path else key
            if key in known:
                continue
            if key in ignored:
                self.warnings.append(f"{full}: not modelled by workbench; ignored")
                continue
            self.errors.append(
                f"{full}: unknown key; known keys here: {', '.join(sorted(known | ignored))}"
            )

    def integer(self, block: dict[str, Any], key: str, path: str, minimum: int) -> int | None:
        if key not in block:
            return None
        v = block[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.errors.append(f"{path}={v!r}: must be an integer >= {minimum}")
            return None
        return v

    def number(
        self, block: dict[str, Any], key: str, path: str, *, allow_zero: bool = True
    ) -> float | None:
        if key not in block:
            return None
        v = block[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v >= 0 if allow_zero else v > 0)
        if not ok:
            rng = ">= 0" if allow_zero else "> 0"
            self.errors.append(f"{path}={v!r}: must be a finite number {rng}")
            return None
        return float(v)

    def boolean(self, block: dict[str, Any], key: str, path: str) -> bool | None:
        if key not in block:
            return None
        v = block[key]
        if not isinstance(v, bool):
            self.errors.append(f"{path}={v!r}: must be true or false")
            return None
        return v

    def string(self, block: dict[str, Any], key: str, path: str) -> str | None:
        if key not in block:
            return None
        v = block[key]
        if not isinstance(v, str):
            self.errors.append(f"{path}={v!r}: must be a string")
            return None
        return v


def _load(source: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"DeepSpeed config {path!r}: file not found") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"DeepSpeed config {path!r}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"DeepSpeed config {path!r}: must hold a JSON object")
        return data
    raise ValueError(f"source={source!r}: must be a dict or a path to a JSON file")


def import_deepspeed(
    source: dict[str, Any] | str | os.PathLike[str], *, world_size: int | None = None
) -> DeepSpeedImport:
    """Read a DeepSpeed config (dict or JSON path) into a TrainConfig plus warnings.

    Every error is reported at once in one ValueError, each naming the key path, the value
    and what is allowed.
    """
    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise ValueError(f"world_size={world_size!r}: must be an integer >= 1 or None")
    ds = _load(source)
    r = _Reader()
    r.keys(ds, "", KNOWN_TOP_LEVEL, IGNORED_TOP_LEVEL)
    kw: dict[str, Any] = {}

    # ---- batch sizes
    tbs = r.integer(ds, "train_batch_size", "train_batch_size", 1)
    micro = r.integer(ds, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", 1)
    accum = r.integer(ds, "gradient_accumulation_steps", "gradient_accumulation_steps", 1)
    world = _solve_batch(r, ds, tbs, micro, accum, world_size, kw)

    # ---- optimizer
    opt = r.block(ds, "optimizer", "optimizer")
    if opt is not None:
        _read_optimizer(r, opt, kw)

    # ---- scheduler
    sched = r.block(ds, "scheduler", "scheduler")
    if sched is not None:
        _read_scheduler(r, sched, kw)

    # ---- gradient clipping (0 = off in DeepSpeed)
    clip = r.number(ds, "gradient_clipping", "gradient_clipping")
    if clip is not None and clip > 0:
        kw["clip_grad_norm"] = clip

    # ---- precision
    _read_precision(r, ds, kw)

    # ---- ZeRO
    zero = r.block(ds, "zero_optimization", "zero_optimization")
    if zero is not None:
        _read_zero(r, zero, kw)

    if r.errors:
        raise ValueError(_format(r.errors))
    try:
        config = TrainConfig(**kw)
    except ValueError as exc:
        raise ValueError(
            f"DeepSpeed config maps to an invalid TrainConfig: {exc}{_ds_keys_of(str(exc))}"
        ) from None
    return DeepSpeedImport(config=config, world_size=world, warnings=tuple(r.warnings))


def from_deepspeed(
    source: dict[str, Any] | str | os.PathLike[str], *, world_size: int | None = None
) -> TrainConfig:
    """`import_deepspeed(...)`, issuing each warning with `warnings.warn`."""
    result = import_deepspeed(source, world_size=world_size)
    for message in result.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    return result.config


def _solve_batch(
    r: _Reader,
    ds: dict[str, Any],
    tbs: int | None,
    micro: int | None,
    accum: int | None,
    world_size: int | None,
    kw: dict[str, Any],
) -> int:
    present = [
        k
        for k in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        )
        if k in ds
    ]
    if r.errors and any(e.split("=")[0] in present for e in r.errors):
        return world_size or 1
    if tbs is None and micro is None:
        r.errors.append(
            "train_batch_size / train_micro_batch_size_per_gpu: at least one must be given"
        )
        return world_size or 1
    if tbs is not None and micro is not None and accum is not None:
        per_world = micro * accum
        if tbs % per_world:
            r.errors.append(
                f"train_batch_size={tbs}: must equal train_micro_batch_size_per_gpu ({micro}) x "
                f"gradient_accumulation_steps ({accum}) x world size; {tbs} is not a multiple "
                f"of {per_world}"
            )
            return world_size or 1
        world = tbs // per_world
        if world_size is not None and world != world_size:
            r.errors.append(
                f"train_batch_size={tbs}: with micro {micro} and accum {accum} implies world size "
                f"{world}, but world_size={world_size}; must equal {micro * accum * world_size}"
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
                f"train_batch_size={tbs}: must be a multiple of gradient_accumulation_steps "
                f"({accum}) x world size ({world}) = {denom}"
            )
            return world
        kw.update(micro_batch=tbs // denom, grad_accum=accum)
        return world
    denom = micro * world
    if tbs % denom:
        r.errors.append(
            f"train_batch_size={tbs}: must be a multiple of train_micro_batch_size_per_gpu "
            f"({micro}) x world size ({world}) = {denom}"
        )
        return world
    kw.update(micro_batch=micro, grad_accum=tbs // denom)
    return world


def _read_optimizer(r: _Reader, opt: dict[str, Any], kw: dict[str, Any]) -> None:
    r.keys(opt, "optimizer", frozenset({"type", "params"}), frozenset())
    kind = r.string(opt, "type", "optimizer.type")
    params = r.block(opt, "params", "optimizer.params") or {}
    r.keys(params, "optimizer.params", KNOWN_OPTIMIZER_PARAMS, frozenset())
    if kind is None:
        if "type" not in opt:
            r.errors.append("optimizer.type: missing; allowed: Adam, AdamW, SGD")
        return
    lr = r.number(params, "lr", "optimizer.params.lr", allow_zero=False)
    wd = r.number(params, "weight_decay", "optimizer.params.weight_decay")
    if lr is not None:
        kw["lr"] = lr
    if wd is not None:
        kw["weight_decay"] = wd
    for key in ("torch_adam", "dampening", "nesterov"):
        if key in params:
            r.warnings.append(f"optimizer.params.{key}: not modelled by workbench; ignored")
    lowered = kind.lower()
    if lowered in ("adam", "adamw"):
        betas = params.get("betas")
        if betas is not None:
            if not (
                isinstance(betas, list)
                and len(betas) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
            ):
                r.errors.append(f"optimizer.params.betas={betas!r}: must be a list of two numbers")
            elif tuple(float(b) for b in betas) != ADAM_BETAS:
                r.warnings.append(
                    f"optimizer.params.betas={betas!r}: ignored; workbench uses {list(ADAM_BETAS)}"
                )
        eps = r.number(params, "eps", "optimizer.params.eps", allow_zero=False)
        if eps is not None and eps != ADAM_EPS:
            r.warnings.append(f"optimizer.params.eps={eps!r}: ignored; workbench uses {ADAM_EPS}")
        w_mode = r.boolean(params, "adam_w_mode", "optimizer.params.adam_w_mode")
        if "momentum" in params:
            r.errors.append("optimizer.params.momentum: not an Adam parameter; allowed for SGD")
        if lowered == "adamw" or w_mode is None or w_mode:
            kw["optimizer"] = OptimizerName.ADAMW.value
        else:
            kw["optimizer"] = OptimizerName.ADAM.value
    elif lowered == "sgd":
        for key in ("betas", "eps", "adam_w_mode"):
            if key in params:
                r.errors.append(f"optimizer.params.{key}: not an SGD parameter; allowed for Adam")
        momentum = r.number(params, "momentum", "optimizer.params.momentum")
        if momentum is not None and momentum > 1:
            r.errors.append(f"optimizer.params.momentum={momentum!r}: must be <= 1")
        elif momentum:
            kw["optimizer"] = OptimizerName.SGD.value
            kw["momentum"] = momentum
        else:
            kw["optimizer"] = OptimizerName.SGD_NOMOMENTUM.value
    else:
        r.errors.append(f"optimizer.type={kind!r}: must be one of Adam, AdamW, SGD")


def _read_scheduler(r: _Reader, sched: dict[str, Any], kw: dict[str, Any]) -> None:
    r.keys(sched, "scheduler", frozenset({"type", "params"}), frozenset())
    kind = r.string(sched, "type", "scheduler.type")
    params = r.block(sched, "params", "scheduler.params") or {}
    p = "scheduler.params"
    if kind == "WarmupLR":
        r.keys(
            params,
            p,
            frozenset({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"}),
            frozenset(),
        )
        lo = r.number(params, "warmup_min_lr", f"{p}.warmup_min_lr")
        hi = r.number(params, "warmup_max_lr", f"{p}.warmup_max_lr", allow_zero=False)
        n = r.integer(params, "warmup_num_steps", f"{p}.warmup_num_steps", 0)
        kind_w = r.string(params, "warmup_type", f"{p}.warmup_type")
        if lo not in (None, 0.0):
            r.errors.append(f"{p}.warmup_min_lr={lo!r}: allowed: 0")
        if kind_w not in (None, "linear"):
            r.errors.append(f"{p}.warmup_type={kind_w!r}: allowed: linear")
        kw["lr_schedule"] = LRSchedule.CONSTANT.value
        if hi is not None:
            kw["lr"] = hi
        kw["warmup_steps"] = 1000 if n is None else n  # DeepSpeed's default warmup_num_steps
        kw.setdefault("total_steps", max(1000, kw["warmup_steps"]))
    elif kind == "WarmupCosineLR":
        r.keys(
            params,
            p,
            frozenset(
                {
                    "total_num_steps",
                    "warmup_num_steps",
                    "warmup_min_ratio",
                    "cos_min_ratio",
                    "warmup_type",
                }
            ),
            frozenset(),
        )
        total = r.integer(params, "total_num_steps", f"{p}.total_num_steps", 1)
        n = r.integer(params, "warmup_num_steps", f"{p}.warmup_num_steps", 0)
        for key in ("warmup_min_ratio", "cos_min_ratio"):
            v = r.number(params, key, f"{p}.{key}")
            if v not in (None, 0.0):
                r.errors.append(f"{p}.{key}={v!r}: allowed: 0")
        kind_w = r.string(params, "warmup_type", f"{p}.warmup_type")
        if kind_w not in (None, "linear"):
            r.errors.append(f"{p}.warmup_type={kind_w!r}: allowed: linear")
        if total is None:
            r.errors.append(f"{p}.total_num_steps: missing; must be an integer >= 1")
            return
        kw["lr_schedule"] = LRSchedule.COSINE.value
        kw["total_steps"] = total
        kw["warmup_steps"] = n or 0
    elif kind == "OneCycle":
        known = frozenset(
            {
                "cycle_min_lr",
                "cycle_max_lr",
                "cycle_first_step_size",
                "cycle_second_step_size",
                "decay_step_size",
                "cycle_momentum",
            }
        )
        r.keys(params, p, known, frozenset())
        hi = r.number(params, "cycle_max_lr", f"{p}.cycle_max_lr", allow_zero=False)
        lo = r.number(params, "cycle_min_lr", f"{p}.cycle_min_lr")
        first = r.integer(params, "cycle_first_step_size", f"{p}.cycle_first_step_size", 1)
        second = r.integer(params, "cycle_second_step_size", f"{p}.cycle_second_step_size", 1)
        decay = r.integer(params, "decay_step_size", f"{p}.decay_step_size", 0)
        mom = r.boolean(params, "cycle_momentum", f"{p}.cycle_momentum")
        if hi is None or first is None:
            r.errors.append(f"{p}: OneCycle needs cycle_max_lr and cycle_first_step_size")
            return
        if lo is not None and not math.isclose(lo, hi / 25.0, rel_tol=1e-9):
            r.errors.append(f"{p}.cycle_min_lr={lo!r}: allowed: cycle_max_lr / 25 = {hi / 25.0}")
        if decay not in (None, 0):
            r.errors.append(f"{p}.decay_step_size={decay!r}: allowed: 0")
        if mom:
            r.warnings.append(f"{p}.cycle_momentum=True: not modelled by workbench; ignored")
        second = second if second is not None else first
        kw.update(
            lr_schedule=LRSchedule.ONECYCLE.value,
            lr=hi,
            warmup_steps=first,
            total_steps=first + second,
        )
    elif kind is not None:
        r.errors.append(
            f"scheduler.type={kind!r}: must be one of WarmupLR, WarmupCosineLR, OneCycle"
        )
    elif "type" not in sched:
        r.errors.append("scheduler.type: missing; allowed: WarmupLR, WarmupCosineLR, OneCycle")


def _read_precision(r: _Reader, ds: dict[str, Any], kw: dict[str, Any]) -> None:
    enabled: list[str] = []
    fp16 = r.block(ds, "fp16", "fp16")
    if fp16 is not None:
        r.keys(fp16, "fp16", KNOWN_FP16, frozenset())
        on = r.boolean(fp16, "enabled", "fp16.enabled")
        if on:
            enabled.append("fp16")
            kw["precision"] = Precision.FP16.value
            static = r.number(fp16, "loss_scale", "fp16.loss_scale")
            if static not in (None, 0.0):
                r.errors.append(
                    f"fp16.loss_scale={fp16['loss_scale']!r}: static loss scaling is not "
                    "supported; allowed: 0 (dynamic)"
                )
            power = r.integer(fp16, "initial_scale_power", "fp16.initial_scale_power", 0)
            kw["loss_scale_init"] = float(2 ** (16 if power is None else power))
            window = r.integer(fp16, "loss_scale_window", "fp16.loss_scale_window", 1)
            kw["loss_scale_interval"] = 1000 if window is None else window
            hyst = r.integer(fp16, "hysteresis", "fp16.hysteresis", 1)
            if hyst is None or hyst != 1:
                r.warnings.append(
                    f"fp16.hysteresis={2 if hyst is None else hyst}: ignored; workbench exports "
                    "hysteresis 1 (back off on every overflow)"
                )
            for key in ("consecutive_hysteresis", "auto_cast", "fp16_master_weights_and_grads"):
                if fp16.get(key):
                    r.warnings.append(f"fp16.{key}: not modelled by workbench; ignored")
            mls = r.number(fp16, "min_loss_scale", "fp16.min_loss_scale")
            if mls not in (None, 1.0):
                r.warnings.append(f"fp16.min_loss_scale={mls!r}: ignored; workbench uses 1")
    for key in ("bf16", "bfloat16"):
        bf16 = r.block(ds, key, key)
        if bf16 is not None:
            r.keys(bf16, key, KNOWN_BF16, frozenset())
            if r.boolean(bf16, "enabled", f"{key}.enabled"):
                enabled.append(key)
                kw["precision"] = Precision.BF16.value
                for sub in ("bf16_master_weights_and_grads", "bf16_optimizer_states"):
                    if bf16.get(sub):
                        r.warnings.append(f"{key}.{sub}: not modelled by workbench; ignored")
    auto = r.block(ds, "torch_autocast", "torch_autocast")
    if auto is not None:
        r.keys(auto, "torch_autocast", KNOWN_AUTOCAST, frozenset())
        if r.boolean(auto, "enabled", "torch_autocast.enabled"):
            enabled.append("torch_autocast")
            dtype = r.string(auto, "dtype", "torch_autocast.dtype") or "bfloat16"
            dtype = dtype.removeprefix("torch.")
            if dtype in ("bfloat16", "bf16"):
                kw["precision"] = Precision.AMP_BF16.value
            elif dtype in ("float16", "fp16", "half"):
                kw["precision"] = Precision.AMP_FP16.value
            else:
                r.errors.append(
                    f"torch_autocast.dtype={auto['dtype']!r}: allowed: bfloat16, float16"
                )
            if "lower_precision_safe_modules" in auto:
                r.warnings.append(
                    "torch_autocast.lower_precision_safe_modules: not modelled by workbench; ignored"
                )
    if len(enabled) > 1:
        r.errors.append(f"{' and '.join(enabled)}: enabled together; allowed: at most one")


def _read_zero(r: _Reader, zero: dict[str, Any], kw: dict[str, Any]) -> None:
    r.keys(zero, "zero_optimization", KNOWN_ZERO, IGNORED_ZERO)
    stage = r.integer(zero, "stage", "zero_optimization.stage", 0)
    if stage is not None:
        if stage > 3:
            r.errors.append(f"zero_optimization.stage={stage}: must be 0, 1, 2 or 3")
        else:
            kw["zero_stage"] = stage
    nvme_paths: list[str] = []
    for key, field_name in (
        ("offload_optimizer", "offload_optimizer"),
        ("offload_param", "offload_params"),
    ):
        path = f"zero_optimization.{key}"
        block = r.block(zero, key, path)
        if block is None:
            continue
        r.keys(block, path, KNOWN_OFFLOAD, IGNORED_OFFLOAD)
        device = r.string(block, "device", f"{path}.device")
        nvme = r.string(block, "nvme_path", f"{path}.nvme_path")
        choices = OffloadDevice.choices()
        if device is None:
            if "device" not in block:
                r.errors.append(f"{path}.device: missing; allowed: {', '.join(choices)}")
            continue
        if device not in choices:
            r.errors.append(f"{path}.device={device!r}: must be one of {', '.join(choices)}")
            continue
        kw[field_name] = device
        if device == OffloadDevice.NVME.value:
            if nvme is None:
                r.errors.append(
                    f"{path}.nvme_path: missing; NVMe offload needs a writable directory"
                )
            else:
                nvme_paths.append(nvme)
        elif nvme is not None:
            r.warnings.append(f"{path}.nvme_path={nvme!r}: ignored while device is {device!r}")
    if len(set(nvme_paths)) > 1:
        r.errors.append(
            f"zero_optimization nvme_path: {sorted(set(nvme_paths))!r} differ; workbench uses one "
            "nvme_path for both offloads"
        )
    elif nvme_paths:
        kw["nvme_path"] = nvme_paths[0]


def _format(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"invalid DeepSpeed config: {problems[0]}"
    return f"{len(problems)} problems in DeepSpeed config:\n" + "\n".join(
        f"  - {p}" for p in problems
    )


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
}


def _ds_keys_of(message: str) -> str:
    """' (DeepSpeed keys: ...)' for the TrainConfig fields a message names, or ''."""
    import re

    keys: list[str] = []
    for name in re.findall(r"\b([a-z_]+)=", message):
        key = _DS_KEY_OF_FIELD.get(name)
        if key is not None and key not in keys:
            keys.append(key)
    return f" (DeepSpeed keys: {', '.join(keys)})" if keys else ""
