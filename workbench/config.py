"""Training configuration: one frozen dataclass, validated up front.

`TrainConfig` never imports torch, pynvml or ipywidgets. Every problem is reported
at once in a single `ValueError`, each line naming the field, the bad value and
what is allowed; an unknown setting name or choice suggests the close one ("did you
mean"), including the names other trainers use (Lightning's `precision="bf16-mixed"`,
`accumulate_grad_batches`; Hugging Face's `gradient_accumulation_steps`, ...).
Derived quantities are methods that take runtime facts (`effective_batch_size(world_size)`).

A TrainConfig describes a job, which may run on another machine (an exported DeepSpeed
job). What *this* machine and a workbench Session can run of it is a separate question:
`runtime_problems(config)` answers it (an optimizer the Session cannot train, with the
nearest one that it can; an NVMe offload directory that does not exist here).

Past 600 lines because every setting is declared, documented and validated here, in one
place; the DeepSpeed mapping lives in `workbench/dsconfig.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import numbers
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from workbench.inputs import shown


class StrEnum(str, Enum):
    """A str enum whose `str()` is its value (Python 3.10 compatible)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def choices(cls) -> list[str]:
        return [m.value for m in cls]


class Precision(StrEnum):
    FP32 = "fp32"
    AMP_FP16 = "amp-fp16"  # torch autocast fp16 + GradScaler: fp32 weights and grads
    AMP_BF16 = "amp-bf16"  # torch autocast bf16: fp32 weights and grads
    FP16 = "fp16"  # DeepSpeed 16-bit: fp16 weights/grads, fp32 master copy, dynamic loss scale
    BF16 = "bf16"  # DeepSpeed 16-bit: bf16 weights/grads, fp32 master copy

    @property
    def is_deepspeed(self) -> bool:
        return self in (Precision.FP16, Precision.BF16)


class OptimizerName(StrEnum):
    """Optimizers by state layout. A Session trains adamw, adam, sgd and sgd-nomomentum;
    the others are DeepSpeed optimizers (names as DeepSpeed spells them, lowercased) that
    the estimator and the DeepSpeed import/export know (`runtime_problems` says why a
    Session refuses them and which one is nearest), and adam8bit (estimator only)."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"  # with momentum
    SGD_NOMOMENTUM = "sgd-nomomentum"
    ADAM8BIT = "adam8bit"  # estimator only (bitsandbytes-style 8-bit states)
    LAMB = "lamb"  # DeepSpeed FusedLamb (CUDA kernel)
    LION = "lion"  # DeepSpeed FusedLion (CUDA) / DeepSpeedCPULion (optimizer offload)
    ADAGRAD = "adagrad"  # torch.optim.Adagrad / DeepSpeedCPUAdagrad (optimizer offload)
    ONEBIT_ADAM = "onebitadam"  # DeepSpeed 1-bit Adam (not in DeepSpeed 0.19.8)
    ZERO_ONE_ADAM = "zerooneadam"  # DeepSpeed 0/1 Adam (not in DeepSpeed 0.19.8)
    ONEBIT_LAMB = "onebitlamb"  # DeepSpeed 1-bit Lamb (not in DeepSpeed 0.19.8)

    @property
    def is_onebit(self) -> bool:
        """A 1-bit (error-feedback compressed) optimizer; DeepSpeed runs these without ZeRO."""
        return self in (
            OptimizerName.ONEBIT_ADAM,
            OptimizerName.ZERO_ONE_ADAM,
            OptimizerName.ONEBIT_LAMB,
        )


#: Optimizers a workbench Session trains (plain PyTorch and DeepSpeed backends).
SESSION_OPTIMIZERS = (
    OptimizerName.ADAMW,
    OptimizerName.ADAM,
    OptimizerName.SGD,
    OptimizerName.SGD_NOMOMENTUM,
)

#: Why a Session cannot train an optimizer, and the nearest one it can.
_NOT_IN_SESSION: dict[OptimizerName, tuple[str, OptimizerName]] = {
    OptimizerName.ADAM8BIT: ("is available in the memory estimator only", OptimizerName.ADAMW),
    OptimizerName.LAMB: (
        "DeepSpeed's Lamb is FusedLamb, a CUDA kernel (no CPU build), and the Session does "
        "not build it; Lamb is AdamW with a per-layer trust ratio",
        OptimizerName.ADAMW,
    ),
    OptimizerName.LION: (
        "the Session does not build DeepSpeed's Lion (FusedLion needs CUDA; DeepSpeedCPULion "
        "only runs with optimizer offload)",
        OptimizerName.ADAMW,
    ),
    OptimizerName.ADAGRAD: (
        "the Session does not build Adagrad (it carries Adam and SGD state only)",
        OptimizerName.ADAM,
    ),
    OptimizerName.ONEBIT_ADAM: (
        "the Session does not build DeepSpeed's 1-bit optimizers (DeepSpeed 0.19.8 no longer "
        "ships them); 1-bit Adam is Adam with compressed communication and decoupled weight "
        "decay",
        OptimizerName.ADAMW,
    ),
    OptimizerName.ZERO_ONE_ADAM: (
        "the Session does not build DeepSpeed's 1-bit optimizers (DeepSpeed 0.19.8 no longer "
        "ships them); 0/1 Adam is Adam with compressed communication and decoupled weight "
        "decay",
        OptimizerName.ADAMW,
    ),
    OptimizerName.ONEBIT_LAMB: (
        "the Session does not build DeepSpeed's 1-bit optimizers (DeepSpeed 0.19.8 no longer "
        "ships them); 1-bit Lamb is Lamb, AdamW with a per-layer trust ratio, with compressed "
        "communication",
        OptimizerName.ADAMW,
    ),
}


class LRSchedule(StrEnum):
    CONSTANT = "constant"
    COSINE = "cosine"
    ONECYCLE = "onecycle"


class LRScaling(StrEnum):
    NONE = "none"
    LINEAR = "linear"
    SQRT = "sqrt"


class OffloadDevice(StrEnum):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class FsdpMode(StrEnum):
    """PyTorch FSDP's sharding names (FSDP2, `torch.distributed.fsdp.fully_shard`)."""

    OFF = "off"
    FULL_SHARD = "full_shard"  # parameters resharded after forward: ZeRO-3-like
    SHARD_GRAD_OP = "shard_grad_op"  # gathered from forward to backward: ZeRO-2-like peak
    NO_SHARD = "no_shard"  # replicated: DDP-like

    @property
    def shards(self) -> bool:
        """Whether parameters, gradients and optimizer states are split over the ranks."""
        return self in (FsdpMode.FULL_SHARD, FsdpMode.SHARD_GRAD_OP)


class Engine(StrEnum):
    """What trains a config (`engine_for`): the plain PyTorch loop on your own module, a
    DeepSpeed engine, or PyTorch FSDP2. The distributed engines train a copy of it."""

    PLAIN = "plain"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"

    @property
    def copies_model(self) -> bool:
        """Whether the engine trains its own copy of your module (weights copied back)."""
        return self is not Engine.PLAIN


class Device(StrEnum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


_ENUM_FIELDS: dict[str, type[StrEnum]] = {
    "precision": Precision,
    "optimizer": OptimizerName,
    "lr_schedule": LRSchedule,
    "lr_scaling": LRScaling,
    "offload_optimizer": OffloadDevice,
    "offload_params": OffloadDevice,
    "fsdp": FsdpMode,
    "device": Device,
}


#: Names other trainers use for a TrainConfig field (Lightning, Hugging Face, DeepSpeed).
_FIELD_ALIASES: dict[str, str] = {
    "accumulate_grad_batches": "grad_accum",  # Lightning Trainer
    "gradient_accumulation_steps": "grad_accum",  # Hugging Face, DeepSpeed
    "gradient_accumulation": "grad_accum",
    "batch_size": "micro_batch",
    "per_device_train_batch_size": "micro_batch",  # Hugging Face
    "train_micro_batch_size_per_gpu": "micro_batch",  # DeepSpeed
    "learning_rate": "lr",
    "gradient_clip_val": "clip_grad_norm",  # Lightning Trainer
    "max_grad_norm": "clip_grad_norm",  # Hugging Face
    "gradient_clipping": "clip_grad_norm",  # DeepSpeed
    "max_steps": "total_steps",
    "warmup": "warmup_steps",
    "num_warmup_steps": "warmup_steps",
    "lr_scheduler_type": "lr_schedule",  # Hugging Face
    "scheduler": "lr_schedule",
    "gradient_checkpointing": "activation_checkpointing",  # Hugging Face
    "dataloader_num_workers": "num_workers",  # Hugging Face
    "dataloader_pin_memory": "pin_memory",  # Hugging Face
    "zero": "zero_stage",
    "stage": "zero_stage",
    "sharding_strategy": "fsdp",  # FSDP1 / Lightning's FSDPStrategy
    "fsdp_sharding": "fsdp",
    "optim": "optimizer",  # Hugging Face
}

#: Choice values other trainers use -> the workbench's value (or a hint naming several).
_VALUE_ALIASES: dict[str, dict[str, str]] = {
    "precision": {
        # Lightning: "-mixed" is autocast with fp32 weights; "-true" casts the weights.
        "bf16-mixed": "amp-bf16",
        "16-mixed": "amp-fp16",
        "fp16-mixed": "amp-fp16",
        "16": "amp-fp16",
        "bf16-true": "bf16",
        "16-true": "fp16",
        "fp16-true": "fp16",
        "32": "fp32",
        "32-true": "fp32",
        "float32": "fp32",
        "float": "fp32",
        "float16": "fp16",
        "half": "fp16",
        "bfloat16": "bf16",
        "amp": "amp-bf16",
        "mixed": "amp-bf16",
    },
    "optimizer": {
        "adamw_torch": "adamw",  # Hugging Face optim names
        "adamw_torch_fused": "adamw",
        "adamw_hf": "adamw",
        "adamw_8bit": "adam8bit",
        "adamw8bit": "adam8bit",
        "paged_adamw_8bit": "adam8bit",
        "adam_8bit": "adam8bit",
        "fusedadam": "adamw",
        "fusedlamb": "lamb",
        "1bitadam": "onebitadam",
        "onebit-adam": "onebitadam",
        "0/1adam": "zerooneadam",
        "1bitlamb": "onebitlamb",
    },
    "lr_schedule": {
        "constant_with_warmup": "constant",  # Hugging Face
        "warmuplr": "constant",  # DeepSpeed
        "warmupcosinelr": "cosine",
        "cosine_with_warmup": "cosine",
        "cosineannealinglr": "cosine",
        "one_cycle": "onecycle",
        "onecyclelr": "onecycle",
    },
    "device": {"gpu": "cuda"},
    "offload_optimizer": {"disk": "nvme", "ssd": "nvme", "host": "cpu"},
    "offload_params": {"disk": "nvme", "ssd": "nvme", "host": "cpu"},
    "fsdp": {  # FSDP1's ShardingStrategy names
        "no": "off",
        "none": "off",
        "false": "off",
        "hybrid_shard": "full_shard",
        "fullshard": "full_shard",
        "full": "full_shard",
        "shardgradop": "shard_grad_op",
        "noshard": "no_shard",
        "ddp": "no_shard",
    },
}


def did_you_mean(name: str, choices: list[str], aliases: dict[str, str] | None = None) -> str:
    """The close choice for a mistyped `name` as " did you mean 'x'?", or "" when none is
    close. `aliases` maps other trainers' names to a choice."""
    key = name.strip().lower()
    aliases = aliases or {}
    close = difflib.get_close_matches(key, [*choices, *aliases], n=1, cutoff=0.8)
    if not close:
        return ""
    return f" did you mean {aliases.get(close[0], close[0])!r}?"


def _unknown_setting(name: str, value: Any) -> str:
    known = sorted(f.name for f in fields(TrainConfig))
    hint = did_you_mean(name, known, _FIELD_ALIASES)
    label = name if isinstance(name, str) and len(name) <= 80 else shown(name)
    return (
        f"{label}={shown(value)}: unknown setting;{hint or ''} known settings: {', '.join(known)}"
    )


def _is_bool(v: Any) -> bool:
    """True/False, NumPy's booleans included (a numpy.bool_ is no number)."""
    return isinstance(v, bool) or type(v).__name__ in ("bool_", "bool") and hasattr(v, "item")


def _is_int(v: Any) -> bool:
    """An integer: int or a NumPy integer scalar, never a bool."""
    return isinstance(v, numbers.Integral) and not _is_bool(v)


def _is_number(v: Any) -> bool:
    """A finite real number: int, float or a NumPy scalar of either, never a bool."""
    if not isinstance(v, numbers.Real) or _is_bool(v):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _plain_number(v: Any) -> Any:
    """A NumPy scalar as the Python int/float it holds (other values unchanged)."""
    if _is_int(v) and not isinstance(v, int):
        return int(v)
    if _is_number(v) and not isinstance(v, (int, float)):
        return float(v)
    return v


#: Upper bounds of the numeric settings: (bound, as shown, why a larger value is nonsense).
LIMITS: dict[str, tuple[float, str, str]] = {
    "micro_batch": (2**20, "1,048,576", "more samples in one forward pass than any device holds"),
    "grad_accum": (2**20, "1,048,576", "more micro-batches per step than any run accumulates"),
    "lr": (1e3, "1000", "a larger step diverges with every optimizer"),
    "weight_decay": (1e3, "1000", "a larger decay erases the weights in one step"),
    "warmup_steps": (10**12, "10^12", "longer than any training run"),
    "total_steps": (10**12, "10^12", "longer than any training run"),
    "clip_grad_norm": (1e12, "1e12", "a larger threshold never clips: use None for no clipping"),
    "num_workers": (1024, "1024", "more loader processes than any machine runs"),
    "loss_scale_init": (2.0**127, "2^127", "a larger scale is infinite in fp32"),
    "loss_scale_growth": (2.0**16, "65536", "a larger factor overflows at the first growth"),
    "loss_scale_interval": (10**12, "10^12", "the scale would never grow"),
    "seed": (2**63 - 1, "2^63 - 1", "torch and NumPy seeds are 64-bit integers"),
    "checkpoint_every_steps": (10**12, "10^12", "longer than any training run"),
    "checkpoint_every_seconds": (1e9, "10^9", "more than 30 years"),
    "keep_checkpoints": (10**6, "10^6", "more checkpoints than any disk holds"),
}
_MAX_PATH = 4096  # PATH_MAX on Linux


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run. Every field can be changed on a live `Session`
    through `session.update(field=value)` (except `device`); a bad value raises ValueError
    naming every bad field, its value and what is allowed (with "did you mean").

    precision            "fp32"; "amp-bf16", "amp-fp16" (torch autocast; fp32 weights,
                         GradScaler for fp16); "bf16", "fp16" (DeepSpeed 16-bit weights
                         with an fp32 master copy)
    optimizer            "adamw", "adam", "sgd" (with `momentum`), "sgd-nomomentum"; for
                         the estimator and DeepSpeed configs also "adam8bit", "lamb", "lion",
                         "adagrad", "onebitadam", "zerooneadam", "onebitlamb"
    micro_batch          samples per forward pass per rank, >= 1
    grad_accum           micro-batches per optimizer step, >= 1
    lr, weight_decay     learning rate > 0 (before `lr_scaling`), weight decay >= 0
    momentum             SGD momentum in [0, 1)
    lr_schedule          "constant", "cosine", "onecycle" (over `total_steps`, after
                         `warmup_steps` of linear warm-up)
    lr_scaling           "none", "linear", "sqrt": scale `lr` with the effective batch
                         relative to the one the session started with
    clip_grad_norm       total-norm clipping threshold > 0, or None for no clipping
    activation_checkpointing   recompute marked blocks in backward (True / False)
    num_workers, pin_memory    data-loader processes >= 0; pinned host memory
    zero_stage           0, 1, 2 or 3 (DeepSpeed ZeRO)
    compile              run the forward through `torch.compile` (True / False); the first
                         step after a (re)build compiles (its record is marked `warmup`)
    fsdp                 "off", "full_shard", "shard_grad_op", "no_shard" (PyTorch FSDP2;
                         with zero_stage=0 and precision fp32, amp-bf16 or amp-fp16)
    fsdp_reduce_fp32     FSDP under AMP: reduce gradients in fp32 (True) or in the 16-bit
                         compute dtype (False)
    offload_optimizer    "none", "cpu", "nvme" (ZeRO 1-3)
    offload_params       "none", "cpu", "nvme" (ZeRO 3); "cpu" also with fsdp="full_shard"
    nvme_path            the directory for "nvme" offload
    loss_scale_init, loss_scale_growth, loss_scale_backoff, loss_scale_interval
                         the fp16 loss scaler: initial scale (2**16), growth factor > 1,
                         backoff factor in (0, 1), clean steps between growths >= 1
    seed                 data order, built-in models' weights and data, dropout
    device               "auto" (CUDA when available), "cpu", "cuda"
    checkpoint_dir, checkpoint_every_steps, checkpoint_every_seconds, keep_checkpoints
                         where and how often a Session saves, and how many it keeps
    """

    precision: Precision | str = Precision.FP32
    optimizer: OptimizerName | str = OptimizerName.ADAMW
    micro_batch: int = 8
    grad_accum: int = 1
    lr: float = 3e-4
    weight_decay: float = 0.01
    momentum: float = 0.9
    lr_schedule: LRSchedule | str = LRSchedule.CONSTANT
    warmup_steps: int = 0
    total_steps: int = 1000  # horizon of the cosine / onecycle schedules
    lr_scaling: LRScaling | str = LRScaling.NONE
    clip_grad_norm: float | None = None
    activation_checkpointing: bool = False
    num_workers: int = 0
    pin_memory: bool = False
    zero_stage: int = 0
    compile: bool = False
    fsdp: FsdpMode | str = FsdpMode.OFF
    fsdp_reduce_fp32: bool = True
    offload_optimizer: OffloadDevice | str = OffloadDevice.NONE
    offload_params: OffloadDevice | str = OffloadDevice.NONE
    nvme_path: str | None = None
    loss_scale_init: float = 2.0**16
    loss_scale_growth: float = 2.0
    loss_scale_backoff: float = 0.5
    loss_scale_interval: int = 2000
    seed: int = 0
    device: Device | str = Device.AUTO
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int | None = None
    checkpoint_every_seconds: float | None = None
    keep_checkpoints: int = 3

    def __post_init__(self) -> None:
        for name, enum in _ENUM_FIELDS.items():
            value = getattr(self, name)
            if not isinstance(value, enum) and isinstance(value, str):
                with contextlib.suppress(ValueError):  # reported by problems()
                    object.__setattr__(self, name, enum(value.strip().lower()))
        for f in fields(self):  # NumPy scalars are numbers: kept as Python's own
            value = getattr(self, f.name)
            plain = _plain_number(value)
            if _is_bool(value) and not isinstance(value, bool):
                plain = bool(value)
            if plain is not value:
                object.__setattr__(self, f.name, plain)
        problems = self.problems()
        if problems:
            raise ValueError(_format(problems))

    # ----------------------------------------------------------------- checking
    def problems(self) -> list[str]:
        """Every problem with this config, one line each (empty when valid): each field on
        its own, then every combination whose fields are themselves valid."""
        p: list[str] = []
        bad: set[str] = set()

        def report(name: str, line: str) -> None:
            bad.add(name)
            p.append(line)

        for name, enum in _ENUM_FIELDS.items():
            value = getattr(self, name)
            if not isinstance(value, enum):
                hint = (
                    did_you_mean(value, enum.choices(), _VALUE_ALIASES.get(name))
                    if isinstance(value, str) and len(value) < 100
                    else ""
                )
                report(
                    name,
                    f"{name}={shown(value)}: must be one of {', '.join(enum.choices())}"
                    + (f";{hint}" if hint else ""),
                )

        def bound(name: str) -> float:
            return LIMITS[name][0] if name in LIMITS else math.inf

        def limit_text(name: str) -> str:
            if name not in LIMITS:
                return ""
            _, top, why = LIMITS[name]
            return f", at most {top} ({why})"

        def positive_int(name: str, *, minimum: int = 1, optional: bool = False) -> None:
            v = getattr(self, name)
            if optional and v is None:
                return
            if not _is_int(v) or v < minimum or v > bound(name):
                allowed = (
                    f"an integer >= {minimum}" + (" or None" if optional else "") + limit_text(name)
                )
                report(name, f"{name}={shown(v)}: must be {allowed}")

        def positive_float(
            name: str,
            *,
            allow_zero: bool = False,
            optional: bool = False,
            below: float | None = None,
        ) -> None:
            v = getattr(self, name)
            if optional and v is None:
                return
            ok = _is_number(v) and (v >= 0 if allow_zero else v > 0)
            if ok and below is not None:
                ok = v < below
            if ok:
                ok = v <= bound(name)
            if not ok:
                rng = ">= 0" if allow_zero else "> 0"
                if below is not None:
                    rng += f" and < {below:g}"
                report(
                    name,
                    f"{name}={shown(v)}: must be a finite number {rng}"
                    + (" or None" if optional else "")
                    + limit_text(name),
                )

        positive_int("micro_batch")
        positive_int("grad_accum")
        positive_float("lr")
        positive_float("weight_decay", allow_zero=True)
        positive_float("momentum", allow_zero=True, below=1.0)
        positive_int("warmup_steps", minimum=0)
        positive_int("total_steps")
        positive_float("clip_grad_norm", optional=True)
        positive_int("num_workers", minimum=0)
        positive_float("loss_scale_init")
        g = self.loss_scale_growth
        if not _is_number(g) or g <= 1 or g > bound("loss_scale_growth"):
            report(
                "loss_scale_growth",
                f"loss_scale_growth={shown(g)}: must be a finite number > 1"
                + limit_text("loss_scale_growth"),
            )
        if not _is_number(self.loss_scale_backoff) or not 0 < self.loss_scale_backoff < 1:
            report(
                "loss_scale_backoff",
                f"loss_scale_backoff={shown(self.loss_scale_backoff)}: must be a number > 0 "
                "and < 1",
            )
        positive_int("loss_scale_interval")
        positive_int("seed", minimum=0)
        positive_int("checkpoint_every_steps", optional=True)
        positive_float("checkpoint_every_seconds", optional=True)
        positive_int("keep_checkpoints")
        for name in ("activation_checkpointing", "pin_memory", "fsdp_reduce_fp32", "compile"):
            if not isinstance(getattr(self, name), bool):
                report(name, f"{name}={shown(getattr(self, name))}: must be True or False")
        if not _is_int(self.zero_stage) or not 0 <= self.zero_stage <= 3:
            report("zero_stage", f"zero_stage={shown(self.zero_stage)}: must be 0, 1, 2 or 3")
        for name in ("nvme_path", "checkpoint_dir"):
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, str) or not v.strip() or "\0" in v or len(v) > _MAX_PATH:
                report(
                    name,
                    f"{name}={shown(v)}: must be a directory path (a non-empty string of at most "
                    f"{_MAX_PATH} characters, no NUL) or None",
                )

        def ok(*names: str) -> bool:
            return not bad.intersection(names)

        # Combinations: each is checked when the fields it reads are valid on their own.
        if ok("optimizer") and OptimizerName(self.optimizer) is OptimizerName.ADAM8BIT:
            p.append(
                "optimizer='adam8bit': is available in the memory estimator only; a Session "
                "trains with adamw, adam, sgd or sgd-nomomentum"
            )
        if (
            ok("optimizer", "zero_stage")
            and OptimizerName(self.optimizer).is_onebit
            and self.zero_stage != 0
        ):
            optimizer = OptimizerName(self.optimizer)
            p.append(
                f"optimizer={optimizer.value!r}: DeepSpeed's 1-bit optimizers do not run with "
                f"ZeRO; needs zero_stage=0 (zero_stage={self.zero_stage})"
            )
        fsdp = FsdpMode(self.fsdp) if ok("fsdp") else None
        offload_opt = OffloadDevice(self.offload_optimizer) if ok("offload_optimizer") else None
        offload_par = OffloadDevice(self.offload_params) if ok("offload_params") else None
        precision = Precision(self.precision) if ok("precision") else None
        stage = self.zero_stage if ok("zero_stage") else None
        if fsdp is not None and fsdp is not FsdpMode.OFF:
            if stage is not None and stage != 0:
                p.append(
                    f"fsdp={fsdp.value!r}: PyTorch FSDP and DeepSpeed ZeRO are two sharding "
                    f"engines; use one (zero_stage={stage} needs fsdp='off', "
                    "fsdp needs zero_stage=0)"
                )
            if precision is not None and precision.is_deepspeed:
                p.append(
                    f"fsdp={fsdp.value!r}: precision={precision.value!r} is DeepSpeed's 16-bit "
                    "mode; with FSDP use 'amp-bf16' or 'amp-fp16' (FSDP's mixed precision)"
                )
            if offload_opt is not None and offload_opt is not OffloadDevice.NONE:
                p.append(
                    f"offload_optimizer={offload_opt.value!r}: a DeepSpeed (ZeRO-Offload) "
                    "setting; FSDP offloads parameters, gradients and optimizer states "
                    "together with offload_params='cpu'"
                )
            if offload_par is not None and (
                offload_par is OffloadDevice.NVME
                or (offload_par is OffloadDevice.CPU and fsdp is not FsdpMode.FULL_SHARD)
            ):
                p.append(
                    f"offload_params={offload_par.value!r}: FSDP offloads to 'cpu' with "
                    f"fsdp='full_shard' (fsdp={fsdp.value!r})"
                )
        if (
            stage == 0
            and offload_opt is not None
            and offload_opt is not OffloadDevice.NONE
            and fsdp is FsdpMode.OFF
        ):
            p.append(
                f"offload_optimizer={offload_opt.value!r}: needs zero_stage 1, 2 "
                "or 3 (zero_stage=0)"
            )
        if (
            stage is not None
            and offload_par is not None
            and offload_par is not OffloadDevice.NONE
            and stage != 3
            and fsdp is FsdpMode.OFF
        ):
            p.append(
                f"offload_params={offload_par.value!r}: parameter offload needs "
                f"zero_stage=3 (zero_stage={stage})"
            )
        # DeepSpeed's own 16-bit modes (fp16/bf16) with zero_stage=0 are allowed: the
        # Session routes them through the DeepSpeed engine, which supports stage 0.
        uses_nvme = OffloadDevice.NVME in (offload_opt, offload_par)
        if uses_nvme and ok("nvme_path") and not self.nvme_path:
            p.append("nvme_path=None: NVMe offload needs nvme_path, a writable directory")
        # Whether nvme_path exists is a question about the machine: runtime_problems().
        if ok("warmup_steps", "total_steps") and self.warmup_steps > self.total_steps:
            p.append(
                f"warmup_steps={self.warmup_steps}: must not exceed total_steps={self.total_steps}"
            )
        return p

    def validate(self) -> None:
        """Raise `ValueError` listing every problem (a constructed config is already valid)."""
        problems = self.problems()
        if problems:
            raise ValueError(_format(problems))

    # ----------------------------------------------------------------- changing
    def replace(self, **changes: Any) -> TrainConfig:
        """A new validated config with `changes` applied; unknown names are reported too."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(_format([_unknown_setting(k, changes[k]) for k in unknown]))
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from `to_dict()`'s mapping (missing settings keep their defaults)."""
        if not isinstance(data, Mapping):
            raise ValueError(
                f"invalid setting: data={shown(data)}: must be a mapping of setting names to "
                "values (TrainConfig.to_dict())"
            )
        keys = [k for k in data if not isinstance(k, str)]
        if keys:
            raise ValueError(
                f"invalid setting: {shown(keys[0])}={shown(data[keys[0]])}: setting names are "
                "strings"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(_format([_unknown_setting(k, data[k]) for k in unknown]))
        return cls(**data)

    # ----------------------------------------------------------------- derived
    def effective_batch_size(self, world_size: int = 1) -> int:
        """Samples per optimizer step across all data-parallel ranks."""
        if not _is_int(world_size) or world_size < 1:
            raise ValueError(f"world_size={world_size!r}: must be an integer >= 1")
        return int(self.micro_batch) * int(self.grad_accum) * world_size

    @property
    def uses_deepspeed(self) -> bool:
        """True when the config itself asks for DeepSpeed (ZeRO >= 1 or DeepSpeed 16-bit),
        on any number of ranks; `engine_for` says which engine runs it."""
        return int(self.zero_stage) >= 1 or Precision(self.precision).is_deepspeed

    def to_deepspeed(self, world_size: int = 1) -> dict[str, Any]:
        """A DeepSpeed config dict that `deepspeed.initialize` accepts."""
        from workbench.dsconfig import to_deepspeed

        result: dict[str, Any] = to_deepspeed(self, world_size=world_size)
        return result

    @classmethod
    def from_deepspeed(
        cls,
        source: dict[str, Any] | str | os.PathLike[str],
        *,
        world_size: int | None = None,
        base: TrainConfig | None = None,
    ) -> TrainConfig:
        """Read a DeepSpeed config (dict or JSON path) into a TrainConfig, issuing the
        import's warnings (keys the workbench does not model, `"auto"` values filled from
        `base`, default `TrainConfig()`). See `workbench.dsconfig.import_deepspeed`."""
        import warnings

        from workbench.dsconfig import import_deepspeed

        result = import_deepspeed(source, world_size=world_size, base=base)
        for message in result.warnings:
            warnings.warn(message, UserWarning, stacklevel=2)
        config: TrainConfig = result.config
        return config


_dataclass_init = TrainConfig.__init__


def _init_naming_unknown_settings(self: TrainConfig, *args: Any, **kwargs: Any) -> None:
    """TrainConfig's generated __init__, but an unknown keyword is a ValueError that
    suggests the close setting (`accumulate_grad_batches` -> did you mean 'grad_accum'?)."""
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError(_format([_unknown_setting(k, kwargs[k]) for k in unknown]))
    _dataclass_init(self, *args, **kwargs)


TrainConfig.__init__ = _init_naming_unknown_settings  # type: ignore[method-assign]


def engine_for(config: TrainConfig, world_size: int = 1) -> Engine:
    """The one answer to "which engine runs this config on `world_size` ranks": FSDP2 when
    `fsdp` is on; DeepSpeed when the config asks for it (ZeRO >= 1, DeepSpeed 16-bit) or a
    Session trains several ranks without FSDP (its data parallelism is DeepSpeed's ZeRO-0);
    else the plain loop. Every caller (the backends, the prediction, live changes, export)
    asks here; a new engine is one member of `Engine` and one backend file."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size={shown(world_size)}: must be an integer >= 1")
    if FsdpMode(config.fsdp) is not FsdpMode.OFF:
        return Engine.FSDP
    if config.uses_deepspeed or world_size > 1:
        return Engine.DEEPSPEED
    return Engine.PLAIN


def runtime_problems(config: TrainConfig) -> list[str]:
    """What a workbench Session on this machine cannot run of a valid `config`, one line
    each (empty when it can): an optimizer the Session does not train, with why and the
    nearest one it does; an NVMe offload directory that does not exist here or is not
    writable. `TrainConfig.problems()` checks the config itself; this checks the machine."""
    p: list[str] = []
    optimizer = OptimizerName(config.optimizer)
    if optimizer not in SESSION_OPTIMIZERS:
        why, nearest = _NOT_IN_SESSION[optimizer]
        p.append(
            f"optimizer={optimizer.value!r}: cannot train here: {why}; the nearest a Session "
            f"trains is optimizer={nearest.value!r} (a Session trains "
            f"{', '.join(o.value for o in SESSION_OPTIMIZERS)})"
        )
    uses_nvme = OffloadDevice.NVME in (
        OffloadDevice(config.offload_optimizer),
        OffloadDevice(config.offload_params),
    )
    path = config.nvme_path
    if uses_nvme and path and not (os.path.isdir(path) and os.access(path, os.W_OK)):
        p.append(f"nvme_path={path!r}: must be an existing writable directory on this machine")
    return p


def plain_value(v: Any) -> Any:
    """A setting's value as plain data: an enum member as its string."""
    return v.value if isinstance(v, Enum) else v


_plain = plain_value


def problem_lines(exc: BaseException) -> list[str]:
    """A (multi-line) TrainConfig / DeepSpeed-config ValueError as one line per problem,
    without the "N invalid settings:" header and the "invalid setting: " prefixes."""
    lines = [ln.strip().removeprefix("- ") for ln in str(exc).splitlines() if ln.strip()]
    if len(lines) > 1 and re.match(r"^\d+ (invalid settings|problems in)", lines[0]):
        lines = lines[1:]
    return [re.sub(r"^(invalid setting|invalid DeepSpeed config): ", "", ln) for ln in lines]


def format_problems(problems: list[str]) -> str:
    """The text of a ValueError listing `problems` (one line, or a counted list)."""
    if len(problems) == 1:
        return f"invalid setting: {problems[0]}"
    return f"{len(problems)} invalid settings:\n" + "\n".join(f"  - {x}" for x in problems)


_format = format_problems
