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

Past 700 lines because every setting is declared here once, with its label, help, flag and
limits (`Setting`), and validated here; the choices of the choice settings and other
trainers' names are in `workbench/choices.py`; the checks that read several settings at once
and `runtime_problems` in `workbench/settings_check.py`; which engine trains a config and
what it refuses in `workbench/engines.py`; the DeepSpeed mapping lives in
`workbench/deepspeed/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from workbench.choices import (  # the choices, re-exported here
    ENUM_FIELDS,
    FIELD_ALIASES,
    NOT_IN_SESSION,
    SESSION_OPTIMIZERS,
    VALUE_ALIASES,
    Attention,
    Device,
    Documents,
    Engine,
    FsdpMode,
    LoraDtype,
    LRScaling,
    LRSchedule,
    OffloadDevice,
    OptimizerName,
    PipelineSchedule,
    Precision,
    Recompute,
    bf16_true_problem,
    did_you_mean,
)
from workbench.inputs import is_bool, is_int, plain_number, shown
from workbench.problems import ConfigError, SettingProblem, format_problems, problem_lines
from workbench.setting_spec import Setting, allowed_for, field_problem, setting
from workbench.settings_check import (  # runtime_problems and the LoRA targets: re-exported
    combination_problems,
    lora_target_names,
    plain_value,
    runtime_problems,
)


def _unknown_setting(name: str, value: Any) -> SettingProblem:
    known = sorted(f.name for f in fields(TrainConfig))
    hint = did_you_mean(name, known, FIELD_ALIASES) if isinstance(name, str) else ""
    label = name if isinstance(name, str) and len(name) <= 80 else shown(name)
    return SettingProblem(
        label, value, f"unknown setting;{hint or ''} known settings: {', '.join(known)}"
    )


_is_bool, _is_int = is_bool, is_int
#: Values kept as they are without asking what they hold (`plain_number`).
_PLAIN_TYPES = frozenset({int, float, bool, str, type(None), *ENUM_FIELDS.values()})


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (the table below is made from each field's `Setting`)."""

    precision: Precision | str = setting(
        Precision.FP32,
        kind="choice",
        label="precision",
        help="amp-*: torch autocast with fp32 weights (a GradScaler for fp16); bf16, fp16: "
        "DeepSpeed's 16-bit weights with an fp32 master copy; bf16-true: pure bf16 weights, "
        "gradients and optimizer states, no master copy (plain loop and FSDP, not DeepSpeed)",
        flag="--precision",
        metavar="PRECISION",
        panel=1,
        rebuilds=("backend",),
        moves_memory=True,
    )
    optimizer: OptimizerName | str = setting(
        OptimizerName.ADAMW,
        kind="choice",
        label="optimizer",
        help="a Session trains "
        + ", ".join(o.value for o in SESSION_OPTIMIZERS)
        + "; the others are for the estimator and DeepSpeed configs",
        flag="--optimizer",
        metavar="OPTIMIZER",
        rebuilds=("backend",),
        moves_memory=True,
    )
    micro_batch: int = setting(
        8,
        kind="int",
        label="micro-batch",
        help="samples per forward pass per rank",
        flag="--micro-batch",
        metavar="BATCH",
        minimum=1,
        maximum=10**6,
        maximum_text="10^6",
        why="more samples in one forward pass than any device holds",
        panel=2,
        rebuilds=("data", "backend"),
        moves_memory=True,
    )
    grad_accum: int = setting(
        1,
        kind="int",
        label="accumulation",
        help="micro-batches per optimizer step",
        flag="--grad-accum",
        metavar="ACCUM",
        minimum=1,
        maximum=10**6,
        maximum_text="10^6",
        why="more micro-batches per step than any run accumulates",
        panel=3,
        rebuilds=("backend",),
        moves_memory=True,
    )
    lr: float = setting(
        3e-4,
        kind="float",
        label="learning rate",
        help="learning rate, before lr_scaling",
        flag="--lr",
        metavar="LR",
        above=0,
        maximum=1e3,
        maximum_text="1000",
        why="a larger step diverges with every optimizer",
        panel=11,
        rebuilds=("backend",),
    )
    weight_decay: float = setting(
        0.01,
        kind="float",
        label="weight decay",
        help="decoupled weight decay (AdamW), L2 (Adam, SGD)",
        flag="--weight-decay",
        metavar="DECAY",
        minimum=0,
        maximum=1e3,
        maximum_text="1000",
        why="a larger decay erases the weights in one step",
        rebuilds=("backend",),
        moves_memory=True,
    )
    momentum: float = setting(
        0.9,
        kind="float",
        label="momentum",
        help="SGD momentum",
        flag="--momentum",
        metavar="MOMENTUM",
        minimum=0,
        below=1.0,
        rebuilds=("backend",),
    )
    lr_schedule: LRSchedule | str = setting(
        LRSchedule.CONSTANT,
        kind="choice",
        label="LR schedule",
        help="over total_steps, after warmup_steps of linear warm-up",
        flag="--lr-schedule",
        metavar="SCHEDULE",
        panel=12,
        rebuilds=("backend",),
    )
    warmup_steps: int = setting(
        0,
        kind="int",
        label="warm-up steps",
        help="steps of linear LR warm-up, at most total_steps",
        flag="--warmup-steps",
        metavar="STEPS",
        minimum=0,
        maximum=10**12,
        maximum_text="10^12",
        why="longer than any training run",
        rebuilds=("backend",),
    )
    total_steps: int = setting(
        1000,
        kind="int",
        label="total steps",
        help="horizon of the cosine / onecycle schedules",
        flag="--total-steps",
        metavar="STEPS",
        minimum=1,
        maximum=10**12,
        maximum_text="10^12",
        why="longer than any training run",
        rebuilds=("backend",),
    )
    lr_scaling: LRScaling | str = setting(
        LRScaling.NONE,
        kind="choice",
        label="LR scaling",
        help="scale lr with the effective batch relative to the one the session started with",
        rebuilds=("backend",),
    )
    clip_grad_norm: float | None = setting(
        None,
        kind="float",
        label="clip grad norm",
        help="total-norm clipping threshold",
        flag="--clip-grad-norm",
        metavar="NORM",
        above=0,
        maximum=1e12,
        maximum_text="1e12",
        why="a larger threshold never clips: use None for no clipping",
        optional=True,
        none_means="no clipping",
        panel=8,
        rebuilds=("backend",),
    )
    activation_checkpointing: Recompute | bool | str = setting(
        Recompute.NONE,
        kind="choice",
        label="checkpointing",
        help="activation recomputation in backward: none, selective (the attention core of "
        "the built-in GPT's blocks) or full (each marked block keeps only its input); True "
        "means full, False none",
        flag="--activation-checkpointing",
        metavar="MODE",
        panel=9,
        rebuilds=("model",),
        moves_memory=True,
    )
    optimizer_in_backward: bool = setting(
        False,
        kind="bool",
        label="optimizer in backward",
        help="step each parameter as its gradient is ready and free the gradient (the plain "
        "loop; no accumulation, clipping or fp16 loss scaling)",
        flag="--optimizer-in-backward",
        panel=14,
        rebuilds=("backend",),
        moves_memory=True,
    )
    activation_offload: bool = setting(
        False,
        kind="bool",
        label="activation offload",
        help="move the activations the forward saves for backward to host memory and back "
        "for the backward (pinned memory and a side stream on a GPU); switchable live",
        flag="--activation-offload",
        panel=15,
        rebuilds=("forward",),
        moves_memory=True,
    )
    attention: Attention | str = setting(
        Attention.MODEL,
        kind="choice",
        label="attention",
        help="attention kernel: the model's own, eager (scores kept for backward) or sdpa "
        "(PyTorch's fused scaled_dot_product_attention); switchable live",
        flag="--attention",
        metavar="KERNEL",
        panel=13,
        rebuilds=("model",),
        moves_memory=True,
    )
    documents: Documents | str = setting(
        Documents.STREAM,
        kind="choice",
        label="documents",
        help="the built-in text's layout: stream (every window of the characters), padded "
        "(one document per sample, padded) or packed (documents packed into each sample, "
        "attention and positions kept inside each document); tiny-gpt's own data only, "
        "set when a Session is built",
        flag="--documents",
        metavar="LAYOUT",
        moves_memory=True,
    )
    tp: int = setting(
        1,
        kind="int",
        label="tensor parallel",
        help="tensor-parallel size: each layer's matmuls split over this many ranks "
        "(PyTorch's column/row-wise parallel linear layers, a vocabulary-parallel embedding, "
        "head and loss), data parallel (or `fsdp`) over the rest; must divide the ranks, "
        "the heads and the widths; set when a Session is built",
        flag="--tp",
        metavar="SIZE",
        minimum=1,
        maximum=64,
        maximum_text="64",
        why="more ranks than a tensor-parallel group spans on one node",
        moves_memory=True,
    )
    sequence_parallel: bool = setting(
        False,
        kind="bool",
        label="sequence parallel",
        help="with `tp` > 1: the layer norms, dropout and residual stream split along the "
        "sequence over the tensor-parallel ranks (gathered before each column-parallel "
        "matmul, reduce-scattered after each row-parallel one) instead of whole on every "
        "rank; the built-in GPT; the sequence length must divide by `tp`",
        flag="--sequence-parallel",
        moves_memory=True,
    )
    pp: int = setting(
        1,
        kind="int",
        label="pipeline stages",
        help="pipeline-parallel stages: the layers cut into this many consecutive stages, "
        "one a rank (torch.distributed.pipelining), the `grad_accum` micro-batches of a "
        "step flowing through them; data parallel over the rest of the ranks; must divide "
        "the ranks and the layers; set when a Session is built",
        flag="--pp",
        metavar="STAGES",
        minimum=1,
        maximum=64,
        maximum_text="64",
        why="more stages than a pipeline of this tool's models has layers",
        moves_memory=True,
    )
    pp_schedule: PipelineSchedule | str = setting(
        PipelineSchedule.ONE_F_ONE_B,
        kind="choice",
        label="pipeline schedule",
        help="1f1b (one forward, one backward: at most `pp` micro-batches in flight) or "
        "gpipe (all forwards, then all backwards: every micro-batch in flight)",
        flag="--pp-schedule",
        metavar="SCHEDULE",
        rebuilds=("backend",),
    )
    lora_rank: int = setting(
        0,
        kind="int",
        label="LoRA rank",
        help="LoRA adapters of this rank on the target layers through peft, the base weights "
        "frozen (0: off); switching rebuilds at a step boundary, merging the adapters trained "
        "so far into the base",
        flag="--lora-rank",
        metavar="RANK",
        minimum=0,
        maximum=4096,
        maximum_text="4096",
        why="wider than the layers LoRA adapts",
        panel=16,
        rebuilds=("backend",),
        moves_memory=True,
    )
    lora_alpha: float = setting(
        16.0,
        kind="float",
        label="LoRA alpha",
        help="LoRA scaling numerator: the adapters' update is scaled by alpha / rank",
        flag="--lora-alpha",
        metavar="ALPHA",
        above=0,
        maximum=1e6,
        maximum_text="10^6",
        why="a larger scale swamps the base weights",
        rebuilds=("backend",),
    )
    lora_dropout: float = setting(
        0.0,
        kind="float",
        label="LoRA dropout",
        help="dropout on the adapters' input (each target keeps its own dropped copy)",
        flag="--lora-dropout",
        metavar="P",
        minimum=0,
        below=1.0,
        rebuilds=("backend",),
        moves_memory=True,
    )
    lora_targets: str = setting(
        "all-linear",
        kind="text",
        label="LoRA targets",
        help='the layers that get adapters: "all-linear" (every nn.Linear, or GPT-2\'s '
        "Conv1D, but the output head) or comma-separated module names or name endings "
        "(qkv,proj; c_attn)",
        flag="--lora-targets",
        metavar="NAMES",
        rebuilds=("backend",),
        moves_memory=True,
    )
    qlora: bool = setting(
        False,
        kind="bool",
        label="QLoRA",
        help="LoRA over a 4-bit NF4 base (bitsandbytes' Linear4bit in the plain loop, "
        "torchao's NF4 tensor under FSDP on 2+ ranks); the original weights stay in host "
        "memory and get the merged adapters back",
        flag="--qlora",
        rebuilds=("backend",),
        moves_memory=True,
    )
    lora_dtype: LoraDtype | str = setting(
        LoraDtype.AUTO,
        kind="choice",
        label="LoRA dtype",
        help="the adapters' dtype: auto (the trained weights': bf16 under bf16-true, as "
        "torchtune keeps them) or fp32 (over a bf16 base, peft's get_peft_model default)",
        flag="--lora-dtype",
        metavar="DTYPE",
        rebuilds=("backend",),
        moves_memory=True,
    )
    num_workers: int = setting(
        0,
        kind="int",
        label="loader workers",
        help="data-loader processes",
        flag="--num-workers",
        metavar="WORKERS",
        minimum=0,
        maximum=1024,
        maximum_text="1024",
        why="more loader processes than any machine runs",
        panel=10,
        rebuilds=("data",),
    )
    pin_memory: bool = setting(
        False,
        kind="bool",
        label="pinned memory",
        help="pinned host memory for the batches",
        flag="--pin-memory",
        rebuilds=("data",),
    )
    zero_stage: int = setting(
        0,
        kind="int",
        label="ZeRO stage",
        help="DeepSpeed ZeRO stage",
        flag="--zero",
        metavar="STAGE",
        values=(0, 1, 2, 3),
        panel=4,
        rebuilds=("backend",),
        moves_memory=True,
    )
    compile: bool = setting(
        False,
        kind="bool",
        label="compile",
        help="run the forward through torch.compile (the first step after a build compiles)",
        rebuilds=("backend",),
        moves_memory=True,
    )
    fsdp: FsdpMode | str = setting(
        FsdpMode.OFF,
        kind="choice",
        label="FSDP",
        help="PyTorch FSDP2 instead of ZeRO, with zero_stage=0 and fp32, amp-bf16, amp-fp16 or "
        "bf16-true",
        flag="--fsdp",
        metavar="MODE",
        panel=5,
        rebuilds=("backend",),
        moves_memory=True,
    )
    fsdp_reduce_fp32: bool = setting(
        True,
        kind="bool",
        label="FSDP fp32 reduce",
        help="FSDP under AMP or bf16-true: reduce gradients in fp32 (True) or in the 16-bit "
        "compute dtype",
        rebuilds=("backend",),
        moves_memory=True,
    )
    fsdp_units: str = setting(
        "blocks",
        kind="text",
        label="FSDP units",
        help='the modules FSDP shards as units: "blocks" (each transformer block, the '
        "embedding and the output head their own units, as torchtitan and torchtune shard "
        'them), "blocks-only" (the embedding and head gathered with the root) or '
        "comma-separated module class names or qualified-name patterns (model.layers.*)",
        flag="--fsdp-units",
        metavar="UNITS",
        rebuilds=("backend",),
        moves_memory=True,
    )
    offload_optimizer: OffloadDevice | str = setting(
        OffloadDevice.NONE,
        kind="choice",
        label="offload optimizer",
        help="optimizer states to the CPU or NVMe, ZeRO stage 1-3",
        flag="--offload-optimizer",
        metavar="DEVICE",
        panel=6,
        rebuilds=("backend",),
        moves_memory=True,
    )
    offload_params: OffloadDevice | str = setting(
        OffloadDevice.NONE,
        kind="choice",
        label="offload parameters",
        help="parameters to the CPU or NVMe: ZeRO stage 3, or cpu with fsdp=full_shard",
        flag="--offload-params",
        metavar="DEVICE",
        panel=7,
        rebuilds=("backend",),
        moves_memory=True,
    )
    nvme_path: str | None = setting(
        None,
        kind="path",
        label="NVMe path",
        help="a writable directory for NVMe offload",
        flag="--nvme-path",
        metavar="PATH",
        optional=True,
        rebuilds=("backend",),
    )
    loss_scale_init: float = setting(
        2.0**16,
        kind="float",
        label="initial loss scale",
        help="fp16 initial loss scale, a power of two",
        flag="--loss-scale-init",
        metavar="INIT",
        above=0,
        maximum=2.0**127,
        maximum_text="2^127",
        why="a larger scale is infinite in fp32",
        rebuilds=("backend",),
    )
    loss_scale_growth: float = setting(
        2.0,
        kind="float",
        label="loss-scale growth",
        help="fp16: factor the scale grows by",
        above=1,
        maximum=2.0**16,
        maximum_text="65536",
        why="a larger factor overflows at the first growth",
        rebuilds=("backend",),
    )
    loss_scale_backoff: float = setting(
        0.5,
        kind="float",
        label="loss-scale backoff",
        help="fp16: factor the scale shrinks by after an overflow",
        above=0,
        below=1.0,
        rebuilds=("backend",),
    )
    loss_scale_interval: int = setting(
        2000,
        kind="int",
        label="loss-scale interval",
        help="fp16 steps without overflow before the scale grows",
        flag="--loss-scale-interval",
        metavar="INTERVAL",
        minimum=1,
        maximum=10**12,
        maximum_text="10^12",
        why="the scale would never grow",
        rebuilds=("backend",),
    )
    seed: int = setting(
        0,
        kind="int",
        label="seed",
        help="data order, built-in models' weights and data, dropout",
        flag="--seed",
        metavar="SEED",
        minimum=0,
        maximum=2**63 - 1,
        maximum_text="2^63 - 1",
        why="torch and NumPy seeds are 64-bit integers",
        rebuilds=("data",),
    )
    device: Device | str = setting(
        Device.AUTO,
        kind="choice",
        label="device",
        help="auto takes CUDA when available; not changed on a live session",
        flag="--device",
        metavar="DEVICE",
    )
    checkpoint_dir: str | None = setting(
        None,
        kind="path",
        label="checkpoint folder",
        help="where a Session saves checkpoints and its log",
        optional=True,
    )
    checkpoint_every_steps: int | None = setting(
        None,
        kind="int",
        label="checkpoint every steps",
        help="save every N optimizer steps",
        minimum=1,
        maximum=10**12,
        maximum_text="10^12",
        why="longer than any training run",
        optional=True,
    )
    checkpoint_every_seconds: float | None = setting(
        None,
        kind="float",
        label="checkpoint every seconds",
        help="save every N seconds",
        above=0,
        maximum=1e9,
        maximum_text="10^9",
        why="more than 30 years",
        optional=True,
    )
    keep_checkpoints: int = setting(
        3,
        kind="int",
        label="checkpoints kept",
        help="how many of the newest checkpoints a folder keeps",
        minimum=1,
        maximum=10**6,
        maximum_text="10^6",
        why="more checkpoints than any disk holds",
    )

    def __post_init__(self) -> None:
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            taken = setting_value(name, value)
            if taken is not value:
                object.__setattr__(self, name, taken)
        problems = self.setting_problems()
        if problems:
            raise ConfigError(problems)

    # ----------------------------------------------------------------- checking
    def problems(self) -> list[str]:
        """Every problem with this config, one line each (empty when valid)."""
        return [str(problem) for problem in self.setting_problems()]

    def setting_problems(self) -> list[SettingProblem]:
        """Every problem with this config as data (empty when valid): each field on its
        own, then every combination whose fields are themselves valid
        (`workbench.settings_check.combination_problems`)."""
        p: list[SettingProblem] = []
        bad: set[str] = set()

        def report(name: str, problem: SettingProblem) -> None:
            bad.add(name)
            p.append(problem)

        for name in ENUM_FIELDS:  # the choices first
            problem = _choice_problem(name, getattr(self, name))
            if problem is not None:
                report(name, problem)
        for name, spec in SETTINGS.items():
            if spec.kind == "choice":
                continue  # the enum checks above
            problem = _field_problem(name, getattr(self, name), spec)
            if problem is not None:
                report(name, problem)

        def ok(*names: str) -> bool:
            return not bad.intersection(names)

        p += combination_problems(self, ok)
        return p

    def validate(self) -> None:
        """Raise `ConfigError` (a ValueError) listing every problem (a constructed config is
        already valid)."""
        problems = self.setting_problems()
        if problems:
            raise ConfigError(problems)

    # ----------------------------------------------------------------- changing
    def replace(self, **changes: Any) -> TrainConfig:
        """A new validated config with `changes` applied; unknown names are reported too."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError([_unknown_setting(k, changes[k]) for k in unknown])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """A config from `to_dict()`'s mapping (missing settings keep their defaults)."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                [
                    SettingProblem(
                        "data", data, "must be a mapping of setting names to values (to_dict())"
                    )
                ]
            )
        keys = [k for k in data if not isinstance(k, str)]
        if keys:
            raise ConfigError(
                [SettingProblem(shown(k), data[k], "setting names are strings") for k in keys]
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError([_unknown_setting(k, data[k]) for k in unknown])
        return cls(**data)

    # ----------------------------------------------------------------- derived
    def effective_batch_size(self, world_size: int = 1) -> int:
        """Samples per optimizer step across all data-parallel ranks (`world_size` / `tp`
        of them: the ranks of a tensor-parallel group read the same samples)."""
        return int(self.micro_batch) * int(self.grad_accum) * self.data_parallel(world_size)

    def data_parallel(self, world_size: int = 1) -> int:
        """The data-parallel size on `world_size` ranks: `world_size` / (`tp` x `pp`), at
        least 1 (the ranks of one tensor-parallel group or pipeline read the same samples)."""
        if not _is_int(world_size) or world_size < 1:
            raise ConfigError([SettingProblem("world_size", world_size, "must be an integer >= 1")])
        return max(1, world_size // (int(self.tp) * int(self.pp)))

    @property
    def uses_deepspeed(self) -> bool:
        """True when the config itself asks for DeepSpeed (ZeRO >= 1 or DeepSpeed 16-bit),
        on any number of ranks; `workbench.engines.engine_for` says which engine runs it."""
        return int(self.zero_stage) >= 1 or Precision(self.precision).is_deepspeed


#: Every TrainConfig field's `Setting`, in declaration order.
SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(TrainConfig)}

#: Upper bounds of the numeric settings: (bound, as shown, why a larger value is nonsense).
LIMITS: dict[str, tuple[float, str, str]] = {
    name: (spec.maximum, spec.maximum_text, spec.why)
    for name, spec in SETTINGS.items()
    if spec.maximum is not None
}


def setting_choices(name: str) -> list[str]:
    """The allowed values of a choice setting (an enum field), as strings."""
    return ENUM_FIELDS[name].choices()


def allowed_text(name: str) -> str:
    """What `name` accepts, in words ("an integer >= 1, at most 10^6 (...)")."""
    return allowed_for(name, SETTINGS[name])


def _field_problem(name: str, v: Any, spec: Setting) -> SettingProblem | None:
    return field_problem(name, v, spec)


def setting_value(name: str, value: Any) -> Any:
    """`value` as TrainConfig keeps it for setting `name`: a choice's string as its enum
    member (any case; True / False for `activation_checkpointing`: full / none), a NumPy
    or torch number as Python's own; anything else as it is (its problem said later)."""
    enum = ENUM_FIELDS.get(name)
    if enum is Recompute and _is_bool(value):
        return Recompute.FULL if value else Recompute.NONE
    if enum is not None and not isinstance(value, enum) and isinstance(value, str):
        with contextlib.suppress(ValueError):  # reported by problems()
            return enum(value.strip().lower())
    return value if type(value) in _PLAIN_TYPES else plain_number(value)


def value_problem(name: str, value: Any) -> SettingProblem | None:
    """The problem of `value` for setting `name` on its own (its type, range or choices),
    not of what it needs of the other settings; None for a valid value."""
    value = setting_value(name, value)
    if name in ENUM_FIELDS:
        return _choice_problem(name, value)
    return field_problem(name, value, SETTINGS[name])


def _choice_problem(name: str, value: Any) -> SettingProblem | None:
    enum = ENUM_FIELDS[name]
    if isinstance(value, enum):
        return None
    hint = (
        did_you_mean(value, enum.choices(), VALUE_ALIASES.get(name))
        if isinstance(value, str) and len(value) < 100
        else ""
    )
    return SettingProblem(
        name,
        value,
        f"must be one of {', '.join(enum.choices())}"
        + (" (or True: full, False: none)" if enum is Recompute else "")
        + (f";{hint}" if hint else ""),
    )


def _describe_settings() -> str:
    """TrainConfig's docstring: every setting with what it is, what it accepts and its
    default, from the schema."""
    lines = [
        "Settings of one training run. Every field can be changed on a live `Session`",
        "through `session.update(field=value)` (except `device`); a bad value raises",
        'ValueError naming every bad field, its value and what is allowed (with "did you',
        'mean"). Each field declares itself once (`Setting` in its metadata): this table,',
        "the checks, the command-line flags and the panel's controls are made from it.",
        "",
    ]
    for f in fields(TrainConfig):
        spec = SETTINGS[f.name]
        default = plain_value(f.default)
        if spec.optional and f.default is None and spec.none_means:
            default = f"None: {spec.none_means}"
        lines.append(f"{f.name}")
        lines.append(f"    {spec.help}.")
        accepts = (
            "one of " + ", ".join(f'"{c}"' for c in ENUM_FIELDS[f.name].choices())
            if spec.kind == "choice"
            else allowed_text(f.name)
        )
        lines.append(f"    Accepts {accepts}; default {default!r}.")
    return "\n".join(lines)


_dataclass_init = TrainConfig.__init__
_FIELD_NAMES = tuple(f.name for f in fields(TrainConfig))
_KNOWN_FIELDS = frozenset(_FIELD_NAMES)


def _init_naming_unknown_settings(self: TrainConfig, *args: Any, **kwargs: Any) -> None:
    """TrainConfig's generated __init__, but an unknown keyword is a ValueError that
    suggests the close setting (`accumulate_grad_batches` -> did you mean 'grad_accum'?)."""
    if not _KNOWN_FIELDS.issuperset(kwargs):
        unknown = sorted(set(kwargs) - _KNOWN_FIELDS)
        raise ConfigError([_unknown_setting(k, kwargs[k]) for k in unknown])
    _dataclass_init(self, *args, **kwargs)


TrainConfig.__init__ = _init_naming_unknown_settings  # type: ignore[method-assign]


_plain = plain_value


TrainConfig.__doc__ = _describe_settings()


__all__ = [
    "ENUM_FIELDS",
    "FIELD_ALIASES",
    "LIMITS",
    "NOT_IN_SESSION",
    "SESSION_OPTIMIZERS",
    "SETTINGS",
    "VALUE_ALIASES",
    "Attention",
    "Recompute",
    "Device",
    "Documents",
    "Engine",
    "FsdpMode",
    "LRScaling",
    "LRSchedule",
    "LoraDtype",
    "OffloadDevice",
    "OptimizerName",
    "Precision",
    "ConfigError",
    "Setting",
    "SettingProblem",
    "TrainConfig",
    "allowed_text",
    "bf16_true_problem",
    "did_you_mean",
    "format_problems",
    "lora_target_names",
    "plain_value",
    "problem_lines",
    "runtime_problems",
    "setting",
    "setting_choices",
    "setting_value",
    "value_problem",
]
