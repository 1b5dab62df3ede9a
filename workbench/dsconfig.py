"""TrainConfig <-> DeepSpeed JSON, both directions.

`to_deepspeed(config, world_size)` builds the dict `deepspeed.initialize` accepts; the
DeepSpeed backend trains with exactly this dict, so what is exported is what ran. Pure.

`import_deepspeed(source)` reads a DeepSpeed config into a `TrainConfig` by one rule,
DeepSpeed's own (checked with DeepSpeed's code, `workbench.dscheck`, imported on first
use): a config DeepSpeed accepts imports; a key or value DeepSpeed rejects is an error
with DeepSpeed's reason; every key DeepSpeed reads that the workbench does not model
(and every value it models only approximately) is named in one grouped warning and
ignored. `"auto"` values (Hugging Face Trainer configs) are filled from `base`, the
session's own settings (default `TrainConfig()`), and a second warning says what was
chosen. The warnings come back next to the config so a UI can show them;
`from_deepspeed(source)` is the same but issues them with `warnings.warn`.

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

Past 600 lines because both directions of one mapping are kept side by side, key by key, so
a key handled one way is seen the other way; DeepSpeed's own checks are in `dscheck.py`.
"""

from __future__ import annotations

import math
import os
import re
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
from workbench.inputs import shown

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# fp16: DeepSpeed's dynamic loss scaler grows and backs off by a factor of 2 only.
DS_SCALE_FACTOR = 2.0

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

#: Top-level keys the workbench reads into a TrainConfig. Every other key DeepSpeed reads
#: is named in the import's "not modelled" warning; keys DeepSpeed does not read either
#: are named there too, with the close DeepSpeed key.
MODELLED_TOP_LEVEL = frozenset(
    {
        *BATCH_KEYS,
        "optimizer",
        "scheduler",
        "gradient_clipping",
        "fp16",
        "bf16",
        "bfloat16",
        "torch_autocast",
        "zero_optimization",
        "zero_allow_untested_optimizer",  # the export sets it where DeepSpeed needs it
    }
)

#: DeepSpeed optimizer type (lowercased; DeepSpeed matches its own names case-insensitively)
#: -> the workbench's optimizer. "adam" is adam or adamw by `adam_w_mode`; "SGD" is
#: torch.optim.SGD (case-sensitive, as DeepSpeed looks it up in torch.optim).
_OPTIMIZER_OF_TYPE = {
    "adamw": OptimizerName.ADAMW,
    "adagrad": OptimizerName.ADAGRAD,
    "lamb": OptimizerName.LAMB,
    "lion": OptimizerName.LION,
    "onebitadam": OptimizerName.ONEBIT_ADAM,
    "zerooneadam": OptimizerName.ZERO_ONE_ADAM,
    "onebitlamb": OptimizerName.ONEBIT_LAMB,
}
#: The workbench's optimizer -> DeepSpeed's type name (export).
_TYPE_OF_OPTIMIZER = {
    OptimizerName.ADAMW: "AdamW",
    OptimizerName.ADAM: "Adam",
    OptimizerName.SGD: "SGD",
    OptimizerName.SGD_NOMOMENTUM: "SGD",
    OptimizerName.ADAGRAD: "Adagrad",
    OptimizerName.LAMB: "Lamb",
    OptimizerName.LION: "Lion",
    OptimizerName.ONEBIT_ADAM: "OneBitAdam",
    OptimizerName.ZERO_ONE_ADAM: "ZeroOneAdam",
    OptimizerName.ONEBIT_LAMB: "OneBitLamb",
}
#: Optimizers whose class DeepSpeed 0.19 lists as tested with ZeRO (ZERO_SUPPORTED_OPTIMIZERS:
#: torch/Fused/CPU Adam, Adagrad, CPU/Fused Lion). The others need
#: "zero_allow_untested_optimizer": true at stages 1-3; tests/unit/test_dsconfig.py checks
#: this set against DeepSpeed's list.
ZERO_TESTED_OPTIMIZERS = frozenset(
    {OptimizerName.ADAMW, OptimizerName.ADAM, OptimizerName.ADAGRAD, OptimizerName.LION}
)
#: The optimizer parameters the workbench models, per optimizer family; any other given
#: parameter (with a value other than DeepSpeed's default) is listed as not modelled.
_MODELLED_PARAMS = {
    # torch_adam: which implementation runs the same Adam (same state bytes); the export
    # always writes true (no fused/CPU Adam op build)
    "adam": frozenset({"lr", "weight_decay", "betas", "eps", "adam_w_mode", "torch_adam"}),
    "sgd": frozenset({"lr", "weight_decay", "momentum"}),
    "other": frozenset({"lr", "weight_decay", "betas", "eps"}),
}


@dataclass(frozen=True)
class DeepSpeedImport:
    """A DeepSpeed config read back: the TrainConfig, the world size the batch keys imply,
    and the warnings, one string each (at most: the "auto" values filled, the keys not
    modelled, and a 1-bit optimizer the installed DeepSpeed lacks)."""

    config: TrainConfig
    world_size: int
    warnings: tuple[str, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- export
#: DeepSpeed's gradient clipping when a config has no `gradient_clipping` key (0.19:
#: `GRADIENT_CLIPPING_DEFAULT = 1.0`); the export always writes the key.
DEEPSPEED_DEFAULT_CLIPPING = 1.0


def to_deepspeed(config: TrainConfig, world_size: int = 1) -> dict[str, Any]:
    """The DeepSpeed config dict for `config` on `world_size` data-parallel ranks.

    Raises ValueError for settings DeepSpeed cannot express (fp16 growth/backoff factors
    other than 2 and 0.5, a loss_scale_init that is not a power of two, the estimator-only
    adam8bit optimizer). An optimizer ZeRO has not been tested with (SGD, Lamb) gets
    `"zero_allow_untested_optimizer": true` at stages 1-3, which DeepSpeed requires.
    """
    if not isinstance(config, TrainConfig):
        raise ValueError(f"config={shown(config)}: must be a TrainConfig")
    if str(config.fsdp) != "off":
        raise ValueError(
            f"fsdp={shown(str(config.fsdp))}: a PyTorch FSDP setting has no DeepSpeed config; export "
            "it with `workbench export --format fsdp` (or set fsdp='off' and a zero_stage)"
        )
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
    if name is OptimizerName.SGD:
        return {
            "type": "SGD",
            "params": {"lr": lr, "momentum": float(config.momentum), "weight_decay": wd},
        }
    if name is OptimizerName.SGD_NOMOMENTUM:
        return {"type": "SGD", "params": {"lr": lr, "momentum": 0.0, "weight_decay": wd}}
    if name in _TYPE_OF_OPTIMIZER:  # DeepSpeed's own: its defaults for everything else
        return {"type": _TYPE_OF_OPTIMIZER[name], "params": {"lr": lr, "weight_decay": wd}}
    allowed = ", ".join(o.value for o in OptimizerName if o in _TYPE_OF_OPTIMIZER)
    raise ValueError(
        f"optimizer={shown(name.value)}: not expressible in DeepSpeed JSON; allowed: {allowed}"
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
        raise ValueError(
            f"loss_scale_init={shown(init)}: DeepSpeed fp16 needs a power of two (initial_scale_power)"
        )
    if float(config.loss_scale_growth) != DS_SCALE_FACTOR:
        raise ValueError(
            f"loss_scale_growth={shown(config.loss_scale_growth)}: DeepSpeed fp16 grows the scale by "
            f"{DS_SCALE_FACTOR} only; allowed: {DS_SCALE_FACTOR}"
        )
    if float(config.loss_scale_backoff) != 1.0 / DS_SCALE_FACTOR:
        raise ValueError(
            f"loss_scale_backoff={shown(config.loss_scale_backoff)}: DeepSpeed fp16 backs off by "
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
    """Collects, while a config is read: errors (key path, value, what is allowed), the
    keys not modelled, the "auto" values filled, and other notes."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.ignored: list[str] = []  # read by DeepSpeed, not modelled by the workbench
        self.unread: list[str] = []  # not read by DeepSpeed either
        self.filled: list[str] = []  # "auto" values filled from the session's settings
        self.defaulted: list[str] = []  # "auto" values left to DeepSpeed's defaults
        self.auto_paths: set[str] = set()
        self.notes: list[str] = []  # warnings of their own

    def ignore(self, entry: str) -> None:
        self.ignored.append(entry.replace("; ", ", "))  # "; " separates the entries

    def warnings(self, deepspeed_name: str) -> tuple[str, ...]:
        out: list[str] = []
        if self.filled or self.defaulted:
            text = '"auto" values'
            if self.filled:
                text += " filled from the session's settings: " + "; ".join(self.filled)
            if self.defaulted:
                text += ("; and" if self.filled else "") + " left to DeepSpeed's defaults: "
                text += "; ".join(self.defaulted)
            out.append(text)
        if self.ignored or self.unread:
            parts = []
            if self.ignored:
                parts.append(
                    f"not modelled by the workbench, ignored ({len(self.ignored)}): "
                    + "; ".join(self.ignored)
                )
            if self.unread:
                parts.append(
                    f"not read by {deepspeed_name} either, ignored ({len(self.unread)}): "
                    + "; ".join(self.unread)
                )
            out.append(". ".join(parts))
        return (*out, *self.notes)

    def block(self, parent: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
        if key not in parent:
            return None
        value = parent[key]
        if not isinstance(value, dict):
            self.errors.append(f"{path}={shown(value)}: must be a JSON object")
            return None
        return value

    def integer(self, block: dict[str, Any], key: str, path: str, minimum: int) -> int | None:
        if key not in block:
            return None
        v = block[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.errors.append(f"{path}={shown(v)}: must be an integer >= {minimum}")
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
            self.errors.append(f"{path}={shown(v)}: must be a finite number {rng}")
            return None
        return float(v)

    def boolean(self, block: dict[str, Any], key: str, path: str) -> bool | None:
        if key not in block:
            return None
        v = block[key]
        if not isinstance(v, bool):
            self.errors.append(f"{path}={shown(v)}: must be true or false")
            return None
        return v

    def string(self, block: dict[str, Any], key: str, path: str) -> str | None:
        if key not in block:
            return None
        v = block[key]
        if not isinstance(v, str):
            self.errors.append(f"{path}={shown(v)}: must be a string")
            return None
        return v


#: The largest integer a DeepSpeed config may hold: past 2**53 a JSON number is no longer
#: exact in most JSON readers (a float's 53-bit mantissa), and no batch size, step count or
#: bucket size comes near it.
MAX_INTEGER = 2**53
#: How deep a DeepSpeed config may nest: the deepest real one nests 4 levels.
MAX_DEPTH = 32
#: A string value that reads as a boolean or a number where DeepSpeed expects one (keys
#: whose names say they hold a name, a path or a kind are strings by nature).
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off"})
_STRING_KEY = re.compile(
    r"(path|name|dir|file|project|team|group|tag|backend|type|dtype|device|mode|label|prefix|entity)$",
    re.I,
)


def _load(source: dict[str, Any] | str | os.PathLike[str]) -> dict[str, Any]:
    """The config as a dict: a dict as given, or the strict JSON of a regular file
    (`workbench.inputs.read_json`: size and depth bounded, duplicate keys refused)."""
    from workbench.inputs import read_json

    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)):
        data = read_json(source, what="DeepSpeed config", max_depth=MAX_DEPTH)
        if not isinstance(data, dict):
            raise ValueError(
                f"DeepSpeed config {shown(os.fspath(source))}: must hold a JSON object, "
                f"not {type(data).__name__}"
            )
        return data
    raise ValueError(f"source={shown(source)}: must be a dict or a path to a JSON file")


def _too_deep(ds: Any) -> str | None:
    """A problem line when `ds` nests deeper than MAX_DEPTH (iterative: a config nested
    200,000 levels deep is refused, not a RecursionError)."""
    stack: list[tuple[str, Any, int]] = [("", ds, 1)]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                return f"{path or 'the config'}: nested deeper than {MAX_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                stack.append((f"{path}.{key}" if path else str(key), child, depth + 1))
    return None


_DROP = object()


def _cleaned(ds: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """`ds` without the values that make it no JSON-like DeepSpeed config, the problem
    line of each (keys that are not strings, values JSON cannot hold: NaN, infinity,
    integers past MAX_INTEGER, other objects; strings that read as a boolean or a number,
    which DeepSpeed would take as true or coerce) and their key paths. `ds` nests at most
    MAX_DEPTH levels (checked first)."""
    problems: list[str] = []
    dropped: list[str] = []

    def drop(path: str, line: str) -> object:
        problems.append(line)
        dropped.append(path)
        return _DROP

    def clean(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, child in value.items():
                if not isinstance(key, str):
                    drop(path, f"{path + '.' if path else ''}{shown(key)}: keys must be strings")
                    continue
                kept = clean(child, f"{path}.{key}" if path else key)
                if kept is not _DROP:
                    out[key] = kept
            return out
        if isinstance(value, (list, tuple)):
            items = [clean(child, f"{path}[{i}]") for i, child in enumerate(value)]
            return _DROP if _DROP in items else items
        if value is None or isinstance(value, (bool, str)):
            line = _string_problem(path, value) if isinstance(value, str) else None
            return value if line is None else drop(path, line)
        if isinstance(value, int):
            if abs(value) > MAX_INTEGER:
                return drop(
                    path,
                    f"{path}={shown(value)}: larger than {MAX_INTEGER:,} (2**53, the largest "
                    "integer a JSON number holds exactly)",
                )
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                return drop(path, f"{path}={shown(value)}: must be a finite number")
            return value
        return drop(
            path,
            f"{path}={shown(value)}: a {type(value).__name__} is no JSON value (numbers, "
            "strings, true/false, null, lists and objects)",
        )

    return clean(ds, ""), problems, dropped


def _string_problem(path: str, value: str) -> str | None:
    """A problem line for a string that reads as a boolean or a number, else None."""
    key = re.sub(r"\[\d+\]$", "", path).rpartition(".")[2]
    if _STRING_KEY.search(key) or value == "auto":
        return None
    text = value.strip().lower()
    if text in _BOOL_WORDS:
        meant = "true" if text in ("true", "yes", "on") else "false"
        return (
            f"{path}={shown(value)}: a string where DeepSpeed expects true or false; write "
            f"{meant} without quotes"
        )
    try:
        number = float(text)
    except ValueError:
        return None
    if "_" in text:
        return (
            f"{path}={shown(value)}: a string where DeepSpeed expects a number; write it "
            "without quotes and without '_' separators"
        )
    written = shown(
        number if not number.is_integer() or "e" in text or "." in text else int(number)
    )
    return (
        f"{path}={shown(value)}: a string where DeepSpeed expects a number; write {written} "
        "without quotes"
    )


def import_deepspeed(
    source: dict[str, Any] | str | os.PathLike[str],
    *,
    world_size: int | None = None,
    base: TrainConfig | None = None,
) -> DeepSpeedImport:
    """Read a DeepSpeed config (dict or JSON path) into a TrainConfig plus warnings.

    `base` (default `TrainConfig()`): the session's settings, which fill `"auto"` values
    and the fields DeepSpeed JSON cannot express. Every error is reported at once in one
    ValueError, each naming the key path, the value and the reason (DeepSpeed's own where
    DeepSpeed rejects the key).
    """
    from workbench import dscheck

    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise ValueError(f"world_size={shown(world_size)}: must be an integer >= 1 or None")
    if base is None:
        base = TrainConfig()
    elif not isinstance(base, TrainConfig):
        raise ValueError(f"base={shown(base)}: must be a TrainConfig or None")
    raw = _load(source)
    deep = _too_deep(raw)
    if deep is not None:
        raise ValueError(_format([deep]))
    raw, shape, dropped = _cleaned(raw)
    r = _Reader()
    ds = _fill_auto(r, raw, base)
    read_keys = dscheck.top_level_keys()
    for key in ds:
        if key in MODELLED_TOP_LEVEL:
            continue
        if key in read_keys:
            r.ignore(key)
        else:
            r.unread.append(key + dscheck.close_key(key, read_keys))

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

    problems, parsed = dscheck.check_config(ds, batch_keys=BATCH_KEYS)
    r.errors.extend(problems)
    r.errors.extend(dscheck.coercion_problems(ds))
    autocast = ds.get("torch_autocast")
    if isinstance(autocast, dict) and "enabled" in autocast:
        r.boolean(autocast, "enabled", "torch_autocast.enabled")
    if "zero_allow_untested_optimizer" in ds:
        r.boolean(ds, "zero_allow_untested_optimizer", "zero_allow_untested_optimizer")
    if parsed is not None:
        _read_zero(r, ds.get("zero_optimization"), parsed, kw)
        _read_precision(r, ds, parsed, kw, base)

    clip = r.number(ds, "gradient_clipping", "gradient_clipping")
    if clip is None and "gradient_clipping" not in ds:
        clip = DEEPSPEED_DEFAULT_CLIPPING  # absent: DeepSpeed clips at its default
    if clip is not None and clip > 0:  # 0 = off in DeepSpeed
        kw["clip_grad_norm"] = clip

    opt = r.block(ds, "optimizer", "optimizer")
    if opt is not None:
        _read_optimizer(r, opt, kw, ds)
    sched = r.block(ds, "scheduler", "scheduler")
    if sched is not None:
        _read_scheduler(r, sched, kw)

    if shape:  # the problems of what was left out come first; none that follow from it
        r.errors = shape + [e for e in r.errors if not any(p and p in e for p in dropped)]
    if r.errors:
        raise ValueError(_format(list(dict.fromkeys(r.errors))))
    try:
        config = TrainConfig(**kw)
    except ValueError as exc:
        raise ValueError(
            f"DeepSpeed config maps to an invalid TrainConfig: {exc}{_ds_keys_of(str(exc))}"
        ) from None
    return DeepSpeedImport(
        config=config, world_size=world, warnings=r.warnings(dscheck.deepspeed_name())
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
    precision = Precision(base.precision)
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
        "fp16.enabled": (precision is Precision.FP16, "precision"),
        "bf16.enabled": (precision is Precision.BF16, "precision"),
        "bfloat16.enabled": (precision is Precision.BF16, "precision"),
        "torch_autocast.enabled": (
            precision in (Precision.AMP_BF16, Precision.AMP_FP16),
            "precision",
        ),
        "torch_autocast.dtype": (
            "float16" if precision is Precision.AMP_FP16 else "bfloat16",
            "precision",
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
    if optimizer in _TYPE_OF_OPTIMIZER:
        fills["optimizer.type"] = (_TYPE_OF_OPTIMIZER[optimizer], "optimizer")
    return fills


def _fill_auto(r: _Reader, raw: dict[str, Any], base: TrainConfig) -> dict[str, Any]:
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
                    f"{path}='auto': no session setting fills it, and DeepSpeed needs a value "
                    "for a top-level key"
                )

    walk(ds, "")
    return ds


# ---- batch sizes
def _solve_batch(
    r: _Reader,
    ds: dict[str, Any],
    tbs: int | None,
    micro: int | None,
    accum: int | None,
    world_size: int | None,
    kw: dict[str, Any],
) -> int:
    present = [k for k in BATCH_KEYS if k in ds]
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


# ---- ZeRO and precision (as DeepSpeed parsed them)
_ZERO_MODELLED = frozenset(
    {"stage", "offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"}
)


def _read_zero(r: _Reader, raw: Any, parsed: Any, kw: dict[str, Any]) -> None:
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
        if key not in _ZERO_MODELLED:
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
                r.errors.append(f"{path}.nvme_path: missing; NVMe offload needs a directory")
            else:
                nvme_paths.append(nvme)
        elif nvme is not None:
            r.ignore(f"{path}.nvme_path={shown(nvme)} (ignored while device is {shown(device)})")
    if len(set(nvme_paths)) > 1:
        r.errors.append(
            f"zero_optimization nvme_path: {sorted(set(nvme_paths))!r} differ; workbench uses one "
            "nvme_path for both offloads"
        )
    elif nvme_paths:
        kw["nvme_path"] = nvme_paths[0]


def _read_precision(
    r: _Reader, ds: dict[str, Any], parsed: Any, kw: dict[str, Any], base: TrainConfig
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
            r.errors.append(
                f"torch_autocast.dtype={ds['torch_autocast'].get('dtype')!r}: torch autocast "
                "needs a 16-bit floating dtype; allowed: bfloat16, float16"
            )
    elif r.auto_paths & {"fp16.enabled", "bf16.enabled", "bfloat16.enabled"}:
        kw["precision"] = Precision(base.precision).value
        r.filled.append(f"precision={shown(kw['precision'])} (precision)")
    if autocast and (fc.enabled or bc.enabled):
        on = "fp16" if fc.enabled else bf_key
        r.ignore(f"torch_autocast (together with {on}: the workbench trains {on} alone)")
    if autocast and "lower_precision_safe_modules" in (ds.get("torch_autocast") or {}):
        r.ignore("torch_autocast.lower_precision_safe_modules")


def _read_fp16(r: _Reader, given: dict[str, Any], fc: Any, kw: dict[str, Any]) -> None:
    if fc.loss_scale:
        r.ignore(
            f"fp16.loss_scale={shown(given.get('loss_scale'))} (static loss scaling, the workbench "
            "scales dynamically)"
        )
    kw["loss_scale_init"] = float(2 ** int(fc.initial_scale_power))
    kw["loss_scale_interval"] = int(fc.loss_scale_window)
    if int(fc.hysteresis) != 1:
        default = "" if "hysteresis" in given else ", DeepSpeed's default"
        r.ignore(
            f"fp16.hysteresis={fc.hysteresis} (the workbench backs off on every overflow, "
            f"hysteresis 1{default})"
        )
    if int(fc.min_loss_scale) != 1:
        r.ignore(f"fp16.min_loss_scale={fc.min_loss_scale} (the workbench uses 1)")
    for key in ("consecutive_hysteresis", "auto_cast", "fp16_master_weights_and_grads"):
        if getattr(fc, key):
            r.ignore(f"fp16.{key}=True")


# ---- optimizer and scheduler (as the engine builds them)
def _read_optimizer(
    r: _Reader, opt: dict[str, Any], kw: dict[str, Any], ds: dict[str, Any]
) -> None:
    from workbench import dscheck

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
    problems = dscheck.optimizer_problems(
        kind, params, zero_stage=int(kw["zero_stage"]), offload=offload, allow_untested=allow
    )
    r.errors.extend(problems)
    lowered = kind.lower()
    if lowered == "adam":
        w_mode = r.boolean(params, "adam_w_mode", "optimizer.params.adam_w_mode")
        name = OptimizerName.ADAMW if w_mode is None or w_mode else OptimizerName.ADAM
    elif lowered in _OPTIMIZER_OF_TYPE:
        name = _OPTIMIZER_OF_TYPE[lowered]
    elif kind == "SGD":
        momentum = r.number(params, "momentum", "optimizer.params.momentum")
        if momentum is not None and momentum > 1:
            r.errors.append(f"optimizer.params.momentum={shown(momentum)}: must be <= 1")
            return
        name = OptimizerName.SGD if momentum else OptimizerName.SGD_NOMOMENTUM
        if momentum:
            kw["momentum"] = momentum
    else:
        if not any(p.startswith("optimizer.type=") for p in problems):
            modelled = sorted({*_TYPE_OF_OPTIMIZER.values()})
            r.errors.append(
                f"optimizer.type={shown(kind)}: {dscheck.deepspeed_name()} builds it, but the "
                f"workbench does not model its state; modelled: {', '.join(modelled)}"
            )
        return
    kw["optimizer"] = name.value
    if name.is_onebit and not dscheck.onebit_available():
        r.notes.append(
            f"optimizer.type={shown(kind)}: {dscheck.deepspeed_name()} (installed) has no 1-bit "
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
    known = _MODELLED_PARAMS[family]
    if name is OptimizerName.ADAGRAD:
        known = frozenset({"lr", "weight_decay"})
    if "betas" in params and "betas" in known:
        betas = params["betas"]
        if not (
            isinstance(betas, list)
            and len(betas) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
        ):
            r.errors.append(f"optimizer.params.betas={shown(betas)}: must be a list of two numbers")
        elif tuple(float(b) for b in betas) != ADAM_BETAS:
            r.ignore(
                f"optimizer.params.betas={shown(betas)} (the workbench uses {list(ADAM_BETAS)})"
            )
    if "eps" in params and "eps" in known:
        eps = r.number(params, "eps", "optimizer.params.eps", allow_zero=False)
        if eps is not None and eps != ADAM_EPS:
            r.ignore(f"optimizer.params.eps={shown(eps)} (the workbench uses {ADAM_EPS})")
    defaults = dscheck.optimizer_defaults(kind, offload=offload)
    for key, value in params.items():
        if key in known or (key in defaults and defaults[key] == value):
            continue
        if key == "momentum" and family == "sgd":
            continue
        r.ignore(f"optimizer.params.{key}={shown(value)}")


_SCHEDULER_LINEAR = "the workbench warms up linearly"


def _warmup_details(r: _Reader, params: dict[str, Any], p: str) -> None:
    lo = r.number(params, "warmup_min_lr", f"{p}.warmup_min_lr")
    if lo not in (None, 0.0):
        r.ignore(f"{p}.warmup_min_lr={shown(lo)} (the workbench warms up from 0)")
    kind = r.string(params, "warmup_type", f"{p}.warmup_type")
    if kind != "linear":
        default = ", DeepSpeed's default" if kind is None else ""
        r.ignore(f"{p}.warmup_type={kind or 'log'!r} ({_SCHEDULER_LINEAR}{default})")


def _read_scheduler(r: _Reader, sched: dict[str, Any], kw: dict[str, Any]) -> None:
    from workbench import dscheck

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
    problems = dscheck.scheduler_problems(kind, params)
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
                default = ", DeepSpeed's default" if end is None else ""
                r.ignore(
                    f"{p}.cos_min_ratio={0.0001 if end is None else end!r} (the workbench "
                    f"decays to 0{default})"
                )
            kind_w = r.string(params, "warmup_type", f"{p}.warmup_type")
            if kind_w != "linear":
                default = ", DeepSpeed's default" if kind_w is None else ""
                r.ignore(f"{p}.warmup_type={kind_w or 'log'!r} ({_SCHEDULER_LINEAR}{default})")
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
            default = "" if "cycle_momentum" in params else ", DeepSpeed's default"
            r.ignore(f"{p}.cycle_momentum=True (the workbench does not cycle momentum{default})")
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
    "warmup_steps": "scheduler.params.warmup_num_steps",
    "total_steps": "scheduler.params.total_num_steps",
}


def _ds_keys_of(message: str) -> str:
    """' (DeepSpeed keys: ...)' for the TrainConfig fields a message names, or ''."""
    keys: list[str] = []
    for name in re.findall(r"\b([a-z_]+)=", message):
        key = _DS_KEY_OF_FIELD.get(name)
        if key is not None and key not in keys:
            keys.append(key)
    return f" (DeepSpeed keys: {', '.join(keys)})" if keys else ""
