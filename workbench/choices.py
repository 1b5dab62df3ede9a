"""The choices of TrainConfig's choice settings, and the names other trainers use.

Each choice setting is a str enum (`Precision`, `OptimizerName`, `FsdpMode`, ...), listed in
`ENUM_FIELDS` by the field that takes it. `FIELD_ALIASES` maps the names Lightning, Hugging
Face and DeepSpeed give a setting to the workbench's, `VALUE_ALIASES` their names for a
choice, and `did_you_mean` turns a near miss into a hint. `Engine` names what trains a
config (`workbench.engines.engine_for` decides it; each engine's facts are its row in
`workbench.engines`); the refusals TrainConfig itself makes of an engine are here, below it.
Pure: imports only the optimizer rows (`workbench.optimizers`), which import nothing, and
`SettingProblem`.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import TYPE_CHECKING, Any

from workbench.optimizers import OPTIMIZERS, ROWS, OptimizerRow
from workbench.problems import SettingProblem


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
    BF16_TRUE = "bf16-true"  # pure bf16 (Lightning's name): bf16 weights, grads, optimizer states,
    # no fp32 master copy, no autocast, no scaler; the plain loop and FSDP (not DeepSpeed)

    @property
    def is_deepspeed(self) -> bool:
        return self in (Precision.FP16, Precision.BF16)


class _OptimizerEnum(StrEnum):
    """Optimizers by state layout, one member per row of `workbench.optimizers.OPTIMIZERS`
    (its `member` and `name`). A Session trains adamw, adam, sgd and sgd-nomomentum; the
    others are DeepSpeed optimizers (names as DeepSpeed spells them, lowercased) that the
    estimator and the DeepSpeed import/export know (`runtime_problems` says why a Session
    refuses them and which one is nearest), and adam8bit (8-bit AdamW: torchao's
    `AdamW8bit` in the plain loop and under FSDP; estimated everywhere), and
    paged-adam8bit (bitsandbytes' `PagedAdamW8bit`, the plain loop); each row says which."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        # the names other libraries give an optimizer (8-bit AdamW: bitsandbytes', torchao's)
        for r in OPTIMIZERS:
            if value in r.aliases:
                return cls(r.name)
        return None

    @property
    def row(self) -> OptimizerRow:
        """Its row: every fact the workbench knows of it."""
        return ROWS[self.value]

    @property
    def is_8bit(self) -> bool:
        """8-bit AdamW, paged or not: two 1-byte moments a parameter."""
        return ROWS[self.value].eight_bit

    @property
    def is_onebit(self) -> bool:
        """A 1-bit (error-feedback compressed) optimizer; DeepSpeed runs these without ZeRO."""
        return ROWS[self.value].error_feedback


if TYPE_CHECKING:  # the members code names; at run time every row's (below)

    class OptimizerName(_OptimizerEnum):
        ADAMW = "adamw"
        ADAM = "adam"
        SGD = "sgd"
        SGD_NOMOMENTUM = "sgd-nomomentum"
        ADAM8BIT = "adam8bit"
        PAGED_ADAM8BIT = "paged-adam8bit"
        LAMB = "lamb"
        LION = "lion"
        ADAGRAD = "adagrad"
        ONEBIT_ADAM = "onebitadam"
        ZERO_ONE_ADAM = "zerooneadam"
        ONEBIT_LAMB = "onebitlamb"

else:
    OptimizerName = _OptimizerEnum(
        "OptimizerName",
        [(r.member, r.name) for r in OPTIMIZERS],
        module=__name__,
        qualname="OptimizerName",
    )
    OptimizerName.__doc__ = _OptimizerEnum.__doc__


#: Optimizers a workbench Session trains (each row's `engines` says on which engines).
SESSION_OPTIMIZERS = tuple(OptimizerName(r.name) for r in OPTIMIZERS if r.in_session)

#: Why a Session cannot train an optimizer, and the nearest one it can.
NOT_IN_SESSION: dict[OptimizerName, tuple[str, OptimizerName]] = {
    OptimizerName(r.name): (r.not_in_session[0], OptimizerName(r.not_in_session[1]))
    for r in OPTIMIZERS
    if r.not_in_session is not None
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


class Attention(StrEnum):
    """The attention kernel a Session trains with (`TrainConfig.attention`): the model's
    own, the unfused one written out in the model (its scores and probabilities kept for
    backward), or PyTorch's `scaled_dot_product_attention` (flash / memory-efficient
    kernels: no s x s tensors kept). A `transformers` model takes it as its
    `attn_implementation`. The estimator counts a kernel named here by
    `workbench.estimate.activations.attention_terms`, the one translation into its own
    `Attention` (sdpa, megatron, eager)."""

    MODEL = "model"
    EAGER = "eager"
    SDPA = "sdpa"


class LoraDtype(StrEnum):
    """The dtype LoRA's adapters train in (`TrainConfig.lora_dtype`): "auto", the trained
    weights' dtype (bf16 under pure bf16, as torchtune keeps them; fp32 otherwise), or
    "fp32", fp32 adapters over a bf16 base, as peft's `get_peft_model` gives them by
    default (`autocast_adapter_dtype=True`)."""

    AUTO = "auto"
    FP32 = "fp32"


class Recompute(StrEnum):
    """Activation recomputation a Session trains with (`TrainConfig.activation_checkpointing`;
    True means "full", False "none"): none; selective (the attention core of each block, its
    scores, probabilities and dropout, recomputed in backward: Korthikanti et al.'s
    selective recomputation, for models whose attention offers it, the built-in GPT's);
    full (each marked block keeps only its input). Truthy unless "none", so a check of
    "is any recomputation on" reads `if config.activation_checkpointing`."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"

    def __bool__(self) -> bool:
        return self is not Recompute.NONE


def session_recompute(checkpointing: object) -> str:
    """The estimator's `checkpointing` as a Session's `activation_checkpointing` (a dry
    run trains what a Session trains): none, selective or full; ValueError for the
    estimator's own modes (selective-op)."""
    value = str(checkpointing)
    if value not in Recompute.choices():
        raise ValueError(
            f"checkpointing={value!r}: a Session (and its dry run) trains none, selective "
            f"or full recomputation; {value!r} is estimated only"
        )
    return value


class Documents(StrEnum):
    """The layout of the built-in text data (`TrainConfig.documents`): the character
    stream cut into windows (no documents), one document per sample padded to the
    sequence length, or documents packed into each sample with attention kept inside
    each document (`workbench.models.gpt.DocumentDataset`)."""

    STREAM = "stream"
    PADDED = "padded"
    PACKED = "packed"


class PipelineSchedule(StrEnum):
    """The order a pipeline runs its micro-batches in (`pp` > 1): one forward, one backward
    after the warm-up ("1f1b": at most `pp` micro-batches' activations in flight on the
    first stage), or every forward then every backward ("gpipe": all of them)."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"


class Engine(StrEnum):
    """What trains a config (`workbench.engines.engine_for`; an engine's facts are its row,
    `workbench.engines.ENGINES[engine]`): the plain PyTorch loop on your own module, a
    DeepSpeed engine, PyTorch FSDP2, PyTorch's tensor parallelism (`tp` > 1, with data
    parallel or FSDP2 over the other ranks) or pipelining (`pp` > 1). The distributed
    engines train a copy of it."""

    PLAIN = "plain"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"
    TENSOR_PARALLEL = "tensor-parallel"  # torch.distributed.tensor.parallel over `tp` ranks
    PIPELINE = "pipeline"  # torch.distributed.pipelining over `pp` stages

    @property
    def copies_model(self) -> bool:
        """Whether the engine trains its own copy of your module (weights copied back)."""
        return self is not Engine.PLAIN


#: Why tensor parallelism and DeepSpeed do not mix.
TP_NOT_DEEPSPEED = (
    "tensor parallelism trains through PyTorch's tensor-parallel API, with data parallel or "
    "FSDP2 (`fsdp`) over the other ranks, not through DeepSpeed: use `zero_stage`=0 and a "
    "torch precision (fp32, amp-bf16, bf16-true)"
)

#: Why pipeline parallelism and DeepSpeed do not mix.
PP_NOT_DEEPSPEED = (
    "pipeline stages train through torch.distributed.pipelining with data parallel over "
    "the other ranks, not through DeepSpeed: use `zero_stage`=0 and a torch precision "
    "(fp32, amp-bf16, bf16-true)"
)


def bf16_true_problem(why: str = "") -> SettingProblem:
    """The problem of pure bf16 (`precision`='bf16-true') on DeepSpeed; `why` says what
    sends the config there ("`zero_stage`=2", "2 ranks without `fsdp` train through it")."""
    deepspeed = f"DeepSpeed ({why})" if why else "DeepSpeed"
    return SettingProblem(
        "precision",
        Precision.BF16_TRUE.value,
        f"pure bf16 has no fp32 master copy of the weights and {deepspeed} always "
        "keeps one: use 'bf16' (DeepSpeed's bf16 with an fp32 master copy), or pure bf16 "
        "with `fsdp` (full_shard, shard_grad_op or no_shard) and `zero_stage`=0",
    )


class Device(StrEnum):
    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


ENUM_FIELDS: dict[str, type[StrEnum]] = {
    "precision": Precision,
    "optimizer": OptimizerName,
    "lr_schedule": LRSchedule,
    "lr_scaling": LRScaling,
    "offload_optimizer": OffloadDevice,
    "offload_params": OffloadDevice,
    "fsdp": FsdpMode,
    "device": Device,
    "attention": Attention,
    "lora_dtype": LoraDtype,
    "activation_checkpointing": Recompute,
    "documents": Documents,
    "pp_schedule": PipelineSchedule,
}


#: Names other trainers use for a TrainConfig field (Lightning, Hugging Face, DeepSpeed).
FIELD_ALIASES: dict[str, str] = {
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
VALUE_ALIASES: dict[str, dict[str, str]] = {
    "precision": {
        # Lightning: "-mixed" is autocast with fp32 weights; "-true" casts the weights
        # ("bf16-true", pure bf16 without a master copy, is a choice of its own).
        "bf16-mixed": "amp-bf16",
        "16-mixed": "amp-fp16",
        "fp16-mixed": "amp-fp16",
        "16": "amp-fp16",
        "bf16_true": "bf16-true",
        "pure_bf16": "bf16-true",  # llama-recipes' FSDP setting
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
        "paged_adamw_8bit": "paged-adam8bit",
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
