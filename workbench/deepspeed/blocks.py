"""The blocks of a DeepSpeed config read into TrainConfig fields: `zero_optimization` and
the precision blocks (`fp16`, `bf16`, `torch_autocast`) as DeepSpeed parsed them, the
`optimizer` and `scheduler` blocks as the engine builds them (checked with DeepSpeed's
code, `workbench.deepspeed.check`). Each reader adds its errors and warnings to the
`Reader` and its fields to `kw`; `from_json.import_deepspeed` calls them in order.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.config import LRSchedule, OffloadDevice, OptimizerName, Precision, TrainConfig
from workbench.deepspeed.check import (
    deepspeed_name,
    onebit_available,
    optimizer_defaults,
    optimizer_problems,
    scheduler_problems,
)
from workbench.deepspeed.keys import (
    ADAM_BETAS,
    ADAM_EPS,
    MODELLED_PARAMS,
    OPTIMIZER_OF_TYPE,
    TYPE_OF_OPTIMIZER,
)
from workbench.deepspeed.problems import KeyProblem, keyed
from workbench.deepspeed.reader import Reader
from workbench.estimate.deepspeed_buffers import READ_KEYS as BUFFER_KEYS
from workbench.inputs import shown

# ---- ZeRO and precision (as DeepSpeed parsed them)
_ZERO_MODELLED = frozenset(
    {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"}
)


def read_zero(r: Reader, raw: Any, parsed: Any, kw: dict[str, Any]) -> None:
    if raw is None:
        return
    zc = parsed.zero_config
    stage = int(zc.stage)
    kw["zero_stage"] = stage
    if isinstance(raw, bool):
        r.notes.append(
            f"zero_optimization={raw}: DeepSpeed's deprecated form, read as stage {stage}"
        )
        return
    for key in raw:
        if key in BUFFER_KEYS:
            r.estimate_only.append(f"zero_optimization.{key}")
        elif key not in _ZERO_MODELLED:
            r.ignore(f"zero_optimization.{key}")
    nvme_paths: list[str] = []
    for key, field_name in (
        ("offload_optimizer", "offload_optimizer"),
        ("offload_param", "offload_params"),
    ):
        block = getattr(zc, key)
        if block is None:
            continue
        path = f"zero_optimization.{key}"
        device = str(getattr(block.device, "value", block.device))
        given = raw.get(key) if isinstance(raw.get(key), dict) else {}
        for sub in given:
            if sub not in ("device", "nvme_path"):
                r.ignore(f"{path}.{sub}")
        if device == OffloadDevice.NONE.value:
            continue
        if key == "offload_param" and stage != 3:
            r.ignore(f"{path} (DeepSpeed offloads parameters at stage 3 only, not {stage})")
            continue
        if key == "offload_optimizer" and stage == 0:
            r.ignore(f"{path} (ZeRO-Offload needs stage 1, 2 or 3, not 0)")
            continue
        kw[field_name] = device
        nvme = None if block.nvme_path is None else str(block.nvme_path)
        if device == OffloadDevice.NVME.value:
            if nvme is None:
                r.errors.append(
                    keyed(f"{path}.nvme_path", "missing; NVMe offload needs a directory")
                )
            else:
                nvme_paths.append(nvme)
        elif nvme is not None:
            r.ignore(f"{path}.nvme_path={shown(nvme)} (ignored while device is {shown(device)})")
    if len(set(nvme_paths)) > 1:
        r.errors.append(
            keyed(
                "zero_optimization nvme_path",
                f"{shown(sorted(set(nvme_paths)))} differ; workbench uses one nvme_path for both "
                "offloads",
            )
        )
    elif nvme_paths:
        kw["nvme_path"] = nvme_paths[0]


def deepspeed_precision(precision: Precision) -> tuple[Precision, str]:
    """The session's precision as a DeepSpeed job takes it, and where it comes from as the
    import's notes say it: pure bf16 ("bf16-true") has no DeepSpeed form, DeepSpeed's bf16
    (bf16 weights with an fp32 master copy) is nearest."""
    if precision is Precision.BF16_TRUE:
        return Precision.BF16, "precision='bf16-true', whose nearest in DeepSpeed is bf16"
    return precision, "precision"


def read_precision(
    r: Reader, ds: dict[str, Any], parsed: Any, kw: dict[str, Any], base: TrainConfig
) -> None:
    fc, bc = parsed.float16_config, parsed.bfloat16_config
    if "bf16" in ds and "bfloat16" in ds:
        r.ignore("bfloat16 (DeepSpeed reads bf16 when both are given)")
    bf_key = "bf16" if "bf16" in ds else "bfloat16"
    autocast = bool(parsed.torch_autocast_enabled)
    if fc.enabled:
        kw["precision"] = Precision.FP16.value
        _read_fp16(r, ds.get("fp16") or {}, fc, kw)
    elif bc.enabled:
        kw["precision"] = Precision.BF16.value
        given = ds.get(bf_key) or {}
        for key, default in (
            ("immediate_grad_update", False),
            ("check_grad_overflow", True),
            ("bf16_master_weights_and_grads", False),
            ("bf16_optimizer_states", False),
        ):
            if getattr(bc, key) != default:
                memory = " (the estimate counts fp32 masters and states)" if "bf16_" in key else ""
                r.ignore(f"{bf_key}.{key}={shown(given.get(key))}{memory}")
    elif autocast:
        dtype = str(parsed.torch_autocast_dtype)
        if dtype == "torch.bfloat16":
            kw["precision"] = Precision.AMP_BF16.value
        elif dtype == "torch.float16":
            kw["precision"] = Precision.AMP_FP16.value
        elif dtype == "None":
            kw["precision"] = Precision.AMP_FP16.value
            r.ignore(
                "torch_autocast.dtype (absent: torch's default for the device, float16 on CUDA: "
                "imported as amp-fp16)"
            )
        elif dtype == "torch.float32":
            r.ignore("torch_autocast.dtype='float32' (autocast to fp32 is fp32 training)")
        else:
            given_dtype = ds["torch_autocast"].get("dtype")
            r.errors.append(
                KeyProblem(
                    "torch_autocast.dtype",
                    given_dtype,
                    "torch autocast needs a 16-bit floating dtype; allowed: bfloat16, float16",
                    value_text=shown(given_dtype),
                )
            )
    elif r.auto_paths & {"fp16.enabled", "bf16.enabled", "bfloat16.enabled"}:
        precision, source = deepspeed_precision(Precision(base.precision))
        kw["precision"] = precision.value
        r.filled.append(f"precision={shown(kw['precision'])} ({source})")
    if autocast and (fc.enabled or bc.enabled):
        on = "fp16" if fc.enabled else bf_key
        r.ignore(f"torch_autocast (together with {on}: the workbench trains {on} alone)")
    if autocast and "lower_precision_safe_modules" in (ds.get("torch_autocast") or {}):
        r.ignore("torch_autocast.lower_precision_safe_modules")


def _read_fp16(r: Reader, given: dict[str, Any], fc: Any, kw: dict[str, Any]) -> None:
    if fc.loss_scale:
        r.ignore(
            f"fp16.loss_scale={shown(given.get('loss_scale'))} (static loss scaling, the workbench "
            "scales dynamically)"
        )
    kw["loss_scale_init"] = float(2 ** int(fc.initial_scale_power))
    kw["loss_scale_interval"] = int(fc.loss_scale_window)
    if int(fc.hysteresis) != 1:
        r.ignore(
            f"fp16.hysteresis={fc.hysteresis} "
            + _why(
                "the workbench backs off on every overflow, hysteresis 1", "hysteresis" not in given
            )
        )
    if int(fc.min_loss_scale) != 1:
        r.ignore(f"fp16.min_loss_scale={fc.min_loss_scale} (the workbench uses 1)")
    for key in ("consecutive_hysteresis", "auto_cast", "fp16_master_weights_and_grads"):
        if getattr(fc, key):
            r.ignore(f"fp16.{key}=True")


# ---- optimizer and scheduler (as the engine builds them)
def read_optimizer(r: Reader, opt: dict[str, Any], kw: dict[str, Any], ds: dict[str, Any]) -> None:
    for key in opt:
        if key == "legacy_fusion":
            r.ignore("optimizer.legacy_fusion")
        elif key not in ("type", "params"):
            r.unread.append(f"optimizer.{key}")
    params = r.block(opt, "params", "optimizer.params") or {}
    if "type" not in opt:
        r.ignore("optimizer (no type: DeepSpeed builds no optimizer, the client's is used)")
        return
    kind = r.string(opt, "type", "optimizer.type")
    if kind is None:
        return
    offload = kw["offload_optimizer"] != OffloadDevice.NONE.value
    allow = ds.get("zero_allow_untested_optimizer") is True
    problems = optimizer_problems(
        kind, params, zero_stage=int(kw["zero_stage"]), offload=offload, allow_untested=allow
    )
    r.errors.extend(problems)
    lowered = kind.lower()
    if lowered == "adam":
        w_mode = r.boolean(params, "adam_w_mode", "optimizer.params.adam_w_mode")
        name = OptimizerName.ADAMW if w_mode is None or w_mode else OptimizerName.ADAM
    elif lowered in OPTIMIZER_OF_TYPE:
        name = OPTIMIZER_OF_TYPE[lowered]
    elif kind == "SGD":
        momentum = r.number(params, "momentum", "optimizer.params.momentum")
        if momentum is not None and momentum > 1:
            r.errors.append(KeyProblem("optimizer.params.momentum", momentum, "must be <= 1"))
            return
        name = OptimizerName.SGD if momentum else OptimizerName.SGD_NOMOMENTUM
        if momentum:
            kw["momentum"] = momentum
    else:
        if not any(p.field == "optimizer.type" for p in problems):
            modelled = sorted({*TYPE_OF_OPTIMIZER.values()})
            r.errors.append(
                KeyProblem(
                    "optimizer.type",
                    kind,
                    f"{deepspeed_name()} builds it, but the workbench does not model its "
                    f"state; modelled: {', '.join(modelled)}",
                )
            )
        return
    kw["optimizer"] = name.value
    if name.is_onebit and not onebit_available():
        r.notes.append(
            f"optimizer.type={shown(kind)}: {deepspeed_name()} (installed) has no 1-bit "
            "optimizers (deepspeed.initialize would fail here); imported for the estimate, "
            "with the state of the DeepSpeed releases that ship it; a Session refuses it "
            "(nearest: adamw)"
        )
    lr = r.number(params, "lr", "optimizer.params.lr", allow_zero=False)
    wd = r.number(params, "weight_decay", "optimizer.params.weight_decay")
    if lr is not None:
        kw["lr"] = lr
    if wd is not None:
        kw["weight_decay"] = wd
    family = {OptimizerName.ADAMW: "adam", OptimizerName.ADAM: "adam"}.get(name, "other")
    if kind == "SGD":
        family = "sgd"
    known = MODELLED_PARAMS[family]
    if name is OptimizerName.ADAGRAD:
        known = frozenset({"lr", "weight_decay"})
    if "betas" in params and "betas" in known:
        betas = params["betas"]
        if not (
            isinstance(betas, list)
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
        ):
            r.errors.append(
                KeyProblem("optimizer.params.betas", betas, "must be a list of two numbers")
            )
        elif tuple(float(b) for b in betas) != ADAM_BETAS:
            r.ignore(
                f"optimizer.params.betas={shown(betas)} (the workbench uses {list(ADAM_BETAS)})"
            )
    if "eps" in params and "eps" in known:
        eps = r.number(params, "eps", "optimizer.params.eps", allow_zero=False)
        if eps is not None and eps != ADAM_EPS:
            r.ignore(f"optimizer.params.eps={shown(eps)} (the workbench uses {ADAM_EPS})")
    defaults = optimizer_defaults(kind, offload=offload)
    for key, value in params.items():
        if key in known or (key in defaults and defaults[key] == value):
            continue
        if key == "momentum" and family == "sgd":
            continue
        r.ignore(f"optimizer.params.{key}={shown(value)}")


_SCHEDULER_LINEAR = "the workbench warms up linearly"


def _why(what: str, defaulted: bool) -> str:
    """Why a value is not carried over, said after it: "(DeepSpeed's default; the
    workbench ...)" where the config left it to DeepSpeed, else "(the workbench ...)"."""
    return f"(DeepSpeed's default; {what})" if defaulted else f"({what})"


def _warmup_details(r: Reader, params: dict[str, Any], p: str) -> None:
    lo = r.number(params, "warmup_min_lr", f"{p}.warmup_min_lr")
    if lo not in (None, 0.0):
        r.ignore(f"{p}.warmup_min_lr={shown(lo)} (the workbench warms up from 0)")
    kind = r.string(params, "warmup_type", f"{p}.warmup_type")
    if kind != "linear":
        r.ignore(f"{p}.warmup_type={shown(kind or 'log')} " + _why(_SCHEDULER_LINEAR, kind is None))


def read_scheduler(r: Reader, sched: dict[str, Any], kw: dict[str, Any]) -> None:
    for key in sched:
        if key not in ("type", "params"):
            r.unread.append(f"scheduler.{key}")
    params = r.block(sched, "params", "scheduler.params") or {}
    if "type" not in sched:
        r.ignore("scheduler (no type: DeepSpeed builds no scheduler)")
        return
    kind = r.string(sched, "type", "scheduler.type")
    if kind is None:
        return
    problems = scheduler_problems(kind, params)
    r.errors.extend(problems)
    if problems:
        return
    p = "scheduler.params"
    if "last_batch_iteration" in params:
        r.ignore(f"{p}.last_batch_iteration")
    if kind == "WarmupLR":
        hi = r.number(params, "warmup_max_lr", f"{p}.warmup_max_lr", allow_zero=False)
        # DeepSpeed needs >= 1; "auto" from a session without warmup means none
        least = 0 if f"{p}.warmup_num_steps" in r.auto_paths else 1
        n = r.integer(params, "warmup_num_steps", f"{p}.warmup_num_steps", least)
        _warmup_details(r, params, p)
        if hi is not None:
            kw["lr"] = hi
        kw["warmup_steps"] = 1000 if n is None else n  # DeepSpeed's default warmup_num_steps
        kw["total_steps"] = max(int(kw["total_steps"]), kw["warmup_steps"])
    elif kind in ("WarmupCosineLR", "WarmupDecayLR"):
        total = r.integer(params, "total_num_steps", f"{p}.total_num_steps", 1)
        least = 0 if f"{p}.warmup_num_steps" in r.auto_paths else 1
        n = r.integer(params, "warmup_num_steps", f"{p}.warmup_num_steps", least)
        if total is None:
            return
        warmup = 1000 if n is None else n  # DeepSpeed's default warmup_num_steps
        if warmup > total:
            r.ignore(f"{p}.warmup_num_steps={warmup} (more than total_num_steps, uses {total})")
            warmup = total
        if kind == "WarmupCosineLR":
            lo = r.number(params, "warmup_min_ratio", f"{p}.warmup_min_ratio")
            if lo == 1.0:
                warmup = 0  # a warmup from 1.0 to 1.0: none (what the export writes)
            elif lo not in (None, 0.0):
                r.ignore(f"{p}.warmup_min_ratio={shown(lo)} (the workbench warms up from 0)")
            end = r.number(params, "cos_min_ratio", f"{p}.cos_min_ratio")
            if end != 0.0:
                r.ignore(
                    f"{p}.cos_min_ratio={shown(0.0001 if end is None else end)} "
                    + _why("the workbench decays to 0", end is None)
                )
            kind_w = r.string(params, "warmup_type", f"{p}.warmup_type")
            if kind_w != "linear":
                r.ignore(
                    f"{p}.warmup_type={shown(kind_w or 'log')} "
                    + _why(_SCHEDULER_LINEAR, kind_w is None)
                )
        else:
            r.ignore(
                "scheduler.type='WarmupDecayLR' (a linear decay to 0, imported as "
                "lr_schedule='cosine' over the same steps: the workbench has no linear decay)"
            )
            hi = r.number(params, "warmup_max_lr", f"{p}.warmup_max_lr", allow_zero=False)
            if hi is not None:
                kw["lr"] = hi
            _warmup_details(r, params, p)
        kw.update(lr_schedule=LRSchedule.COSINE.value, total_steps=total, warmup_steps=warmup)
    elif kind == "OneCycle":
        hi = r.number(params, "cycle_max_lr", f"{p}.cycle_max_lr", allow_zero=False)
        lo = r.number(params, "cycle_min_lr", f"{p}.cycle_min_lr")
        first = r.integer(params, "cycle_first_step_size", f"{p}.cycle_first_step_size", 1)
        second = r.integer(params, "cycle_second_step_size", f"{p}.cycle_second_step_size", 1)
        if hi is None or lo is None:
            return
        if not math.isclose(lo, hi / 25.0, rel_tol=1e-9):
            r.ignore(f"{p}.cycle_min_lr={shown(lo)} (the workbench starts at cycle_max_lr / 25)")
        momentum = params.get("cycle_momentum", True)
        if momentum:
            r.ignore(
                f"{p}.cycle_momentum=True "
                + _why("the workbench does not cycle momentum", "cycle_momentum" not in params)
            )
        for key in (
            "decay_lr_rate",
            "decay_step_size",
            "cycle_first_stair_count",
            "cycle_second_stair_count",
            "cycle_min_mom",
            "cycle_max_mom",
            "decay_mom_rate",
        ):
            if params.get(key):
                r.ignore(f"{p}.{key}={shown(params[key])}")
        first = 2000 if first is None else first  # DeepSpeed's default
        second = first if second is None else second
        kw.update(
            lr_schedule=LRSchedule.ONECYCLE.value,
            lr=hi,
            warmup_steps=first,
            total_steps=first + second,
        )
    else:
        r.ignore(f"scheduler.type={shown(kind)} (not modelled: the workbench trains a constant lr)")
